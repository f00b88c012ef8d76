"""Whole commands as a user runs them: `mergepipe merge` against `mergekit-yaml`, cold cache.

The suite's other rows time the merge call in a warm worker; these time each tool's command
line from start to exit in a fresh process (interpreter start-up, imports, catalog open,
planning, the merge, registering the output, exit), interleaved per repetition, every run on a
cold page cache and, for ours, a fresh copy of the catalog. Medians of `reps`.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mergepipe.core.operators import get_operator
from mergepipe_bench.coldcache import make_cold, resident_fraction
from mergepipe_bench.mergekit_run import CLI_FLAGS, mergekit_config, write_config
from mergepipe_bench.suite import Suite

OPERATOR = "linear"


def command(name: str) -> list[str]:
    """The console script `name` of this interpreter's environment."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    if name == "mergepipe":
        return [sys.executable, "-m", "mergepipe"]
    raise FileNotFoundError(f"no {name} next to {sys.executable}")


def argv_of(suite: Suite, tool: str, k: int, budget: float, rundir: Path
            ) -> tuple[list[str], list[str]]:
    """The command line of one run and the inputs to evict before it."""
    root = suite.families["main"]
    names = suite.experts("main", k)
    inputs = [str(root / "base"), *(str(root / e) for e in names)]
    normalize = get_operator(OPERATOR).normalize_default
    if tool == "mergekit":
        cfg = mergekit_config(OPERATOR, root / "base", [root / e for e in names],
                              params={"normalize": normalize})
        path = write_config(cfg, rundir / "mergekit.yml")
        return ([*command("mergekit-yaml"), str(path), str(rundir / "out"), *CLI_FLAGS,
                 "--random-seed", str(suite.cfg.seed)], inputs)
    catalog = rundir / "catalog.duckdb"
    shutil.copyfile(suite.catalogs["main"], catalog)
    return ([*command("mergepipe"), "--catalog", str(catalog), "merge", "--base", "base",
             "--experts", ",".join(names), "--op", OPERATOR, "--param",
             f"normalize={str(normalize).lower()}", "--budget", f"{budget:g}", "--seed",
             str(suite.cfg.seed), "--out", str(rundir / "out"), "--json"],
            [*inputs, str(catalog)])


def timed(argv: list[str], inputs: list[str]) -> dict[str, float]:
    """Wall and CPU seconds of one command on a cold page cache."""
    files = make_cold(inputs)
    cold = resident_fraction(files)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
            "cold": cold}


def whole_commands(suite: Suite, ks: tuple[int, ...] | None = None,
                   budget: float | None = None, reps: int | None = None) -> list[dict[str, Any]]:
    """Per K: median wall (and CPU) seconds of `mergepipe merge --op linear --budget B` and of
    `mergekit-yaml` of the same merge, and their ratio; the load average around the runs."""
    ks = ks or tuple(dict.fromkeys((suite.cfg.k_main, suite.cfg.k_big)))
    budget = budget if budget is not None else suite.cfg.low_budget
    reps = reps or suite.cfg.reps
    samples: dict[tuple[str, int], list[dict[str, float]]] = {}
    load0 = os.getloadavg()
    for rep in range(reps):
        for k in ks:
            for tool in ("ours", "mergekit"):
                rundir = suite.work / "commands" / f"{tool}-K{k}-rep{rep}"
                shutil.rmtree(rundir, ignore_errors=True)
                rundir.mkdir(parents=True)
                s = timed(*argv_of(suite, tool, k, budget, rundir))
                shutil.rmtree(rundir)
                samples.setdefault((tool, k), []).append(s)
                suite.log(f"  command {tool} {OPERATOR} K{k} budget {budget:g} rep {rep}: "
                          f"{s['wall_s']:.2f} s wall, {s['cpu_s']:.2f} s CPU")
    load1 = os.getloadavg()
    rows = []
    for k in ks:
        ours, mk = samples[("ours", k)], samples[("mergekit", k)]
        med = {f"{tool}_{m}": statistics.median(x[m] for x in xs)
               for tool, xs in (("ours", ours), ("mergekit", mk)) for m in ("wall_s", "cpu_s")}
        rows.append({"operator": OPERATOR, "k": k, "budget": budget, "reps": reps, **med,
                     "speedup": med["mergekit_wall_s"] / med["ours_wall_s"],
                     "ours_walls": [x["wall_s"] for x in ours],
                     "mergekit_walls": [x["wall_s"] for x in mk],
                     "cold_max": max(x["cold"] for x in ours + mk),
                     "load_average": [round(x, 2) for x in (*load0, *load1)]})
    return rows


def targets(rows: list[dict[str, Any]]) -> list[list[str]]:
    """docs/targets.md: linear at 0.1 >= 3x mergekit at K = 8, >= 5x at K = 16 (commands)."""
    out = []
    for r in rows:
        want = 5.0 if r["k"] >= 16 else 3.0
        out.append([f"whole command: `mergepipe merge` linear, budget {r['budget']:g}, K = "
                    f"{r['k']}: >= {want:g}x faster than `mergekit-yaml`",
                    f"{r['speedup']:.2f}x ({r['ours_wall_s']:.2f} s against "
                    f"{r['mergekit_wall_s']:.2f} s)", "met" if r["speedup"] >= want else "missed"])
    return out


def render(rows: list[dict[str, Any]], table: Any) -> str:
    """The report's table of whole commands."""
    if not rows:
        return ""
    return "\n".join([
        "Whole commands as a user runs them, each in a fresh process from start to exit on a "
        "cold page cache (`mergepipe merge --op linear --budget B --json` with a fresh copy of "
        "the catalog; `mergekit-yaml CONFIG OUT " + " ".join(CLI_FLAGS) + "` with "
        "HF_HUB_OFFLINE=1), interleaved, medians (`benchmarks.whole_commands`):\n",
        table(["operator", "K", "budget", "mergepipe merge", "mergekit-yaml", "speedup",
               "CPU (ours / mergekit)", "load average (before; after)"],
              [[r["operator"], r["k"], f"{r['budget']:g}", f"{r['ours_wall_s']:.2f} s",
                f"{r['mergekit_wall_s']:.2f} s", f"{r['speedup']:.2f}x",
                f"{r['ours_cpu_s']:.2f} s / {r['mergekit_cpu_s']:.2f} s",
                " ".join(map(str, r["load_average"][:3])) + "; "
                + " ".join(map(str, r["load_average"][3:]))] for r in rows])])
