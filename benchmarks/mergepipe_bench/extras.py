"""The suite's extra rows: start-up, ingestion vs `cat`, a huge 1-D tensor's ingestion RSS, K = 16 at budget 0.1, where a budgeted merge's time goes."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mergepipe_bench import startup, whole_commands
from mergepipe_bench.coldcache import files_under, make_cold
from mergepipe_bench.ingest_throughput import _cat, _ingest
from mergepipe_bench.proc import child_env, run_timed
from mergepipe_bench.suite import Run, Suite
from mergepipe_bench.whole_commands import command


def big_k(suite: Suite, runs: list[Run]) -> list[dict[str, Any]]:
    """Each operator at k_big: mergekit's full merge against ours at the low budget."""
    rows = []
    for i in range(0, len(runs), 2):
        mk, low = runs[i:i + 2]
        m, lo = suite.median(mk), suite.median(low)
        rows.append({"operator": mk.op, "k": mk.k, "budget": low.budget, "mergekit_s": m,
                     "ours_s": lo, "speedup": m / lo,
                     "expert_bytes": suite.first(low)["summary"]["expert_bytes_read"]})
    return rows


def phases(suite: Suite, run: Run) -> dict[str, Any]:
    """Where one budgeted merge's time goes (medians over its runs): planning, the block loop
    (reads, merge, writes, output statistics, fsync), publishing and registering the output,
    and the rest of the call (catalog open, submitting the merge)."""
    plan = suite.median_result(run, "summary.plan_seconds")
    exec_s = suite.median_result(run, "summary.exec_seconds")
    wall = suite.median_result(run, "summary.wall_seconds")
    merge = suite.median(run)
    s = suite.first(run)["summary"]
    return {"operator": run.op, "k": run.k, "budget": run.budget, "merge_s": merge,
            "plan_s": plan, "exec_s": exec_s, "register_s": max(0.0, wall - plan - exec_s),
            "other_s": max(0.0, merge - wall), "expert_bytes": s["expert_bytes_read"],
            "base_bytes": s["base_bytes_read"]}


def startup_rows(runs: int = 3, catalog: Path | None = None) -> dict[str, Any]:
    """`mergepipe --help`, and with a catalog `models` and `sql` on a copy of it, in fresh
    interpreters: median wall, CPU seconds, modules."""
    out = {"--help": startup.measure(["--help"], runs)}
    if catalog is not None:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "catalog.duckdb"
            shutil.copyfile(catalog, copy)
            for name, argv in (("models", ["models"]),
                               ("sql", ["sql", "SELECT count(*) FROM blocks"])):
                out[name] = startup.measure(["--catalog", str(copy), *argv], runs)
    return out


def ingestion(suite: Suite, runs: int = 3) -> dict[str, Any]:
    """`mergepipe ingest` of one expert with statistics, the command as a user runs it (a
    fresh process, cold cache, a fresh copy of the catalog) against `cat` of the expert and
    its base; medians of `runs`."""
    root = suite.families["main"]
    expert = suite.experts("main", 1)[0]
    files = [f for f in files_under([root / expert, root / "base"])
             if f.endswith(".safetensors")]
    work = suite.work / "ingest-bench"
    samples = []
    for rep in range(runs):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        catalog = work / "catalog.duckdb"
        shutil.copyfile(suite.catalogs["main"], catalog)
        make_cold([*files, str(catalog)])
        t = run_timed([*command("mergepipe"), "--catalog", str(catalog), "ingest",
                       str(root / expert), "--name", f"ingest-bench-{rep}", "--base", "base",
                       "--json"], env=child_env()).check()
        samples.append({"process_s": t.wall_s,
                        "ingest_s": float(json.loads(t.stdout)["ingest_seconds"]),
                        "peak_rss": t.peak_rss, "cat_s": _cat(files)})
    shutil.rmtree(work, ignore_errors=True)
    return {"expert_bytes": sum(Path(f).stat().st_size for f in files if expert in f),
            "read_bytes": sum(Path(f).stat().st_size for f in files),
            **{k: _median([s[k] for s in samples]) for k in samples[0]}}


def one_d_rss(work: Path, mib: int) -> dict[str, Any]:
    """Peak RSS of ingesting (with statistics) an expert whose checkpoint holds one float32
    1-D tensor of `mib` MiB, and of its base (child processes, cold cache)."""
    import numpy as np
    from safetensors.numpy import save_file

    shutil.rmtree(work, ignore_errors=True)
    n = mib * 2**20 // 4
    rng = np.random.default_rng(0)
    base = rng.standard_normal(n, dtype=np.float32)
    small = rng.standard_normal((64, 64), dtype=np.float32)
    for name, delta in (("base", 0.0), ("expert", 1e-3)):
        (work / name).mkdir(parents=True)
        save_file({"big": base + np.float32(delta) * rng.standard_normal(n, dtype=np.float32),
                   "small": small}, str(work / name / "model.safetensors"))
    del base
    catalog = work / "catalog.duckdb"
    out = {"tensor_mib": mib}
    for name, of in (("base", None), ("expert", "base")):
        files = [str(work / name / "model.safetensors")]
        r = _ingest(catalog, work / name, name, files, base=of)
        out[f"{name}_peak_rss"] = r["peak_rss"]
        out[f"{name}_ingest_s"] = r["ingest_s"]
    shutil.rmtree(work, ignore_errors=True)
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _s(x: float) -> str:
    return f"{x:.2f} s"


def _mib(x: float) -> str:
    return f"{x / 2**20:,.0f} MiB"


def targets(res: dict[str, Any]) -> list[list[str]]:
    """docs/targets.md rows of the extra figures: measured, met / missed."""
    rows = whole_commands.targets(res.get("commands", []))
    for b in res.get("big_k", []):
        if b["operator"] == "linear":
            rows.append([f"linear, budget {b['budget'][2:]}, K = {b['k']}: >= 5x faster than "
                         "mergekit", f"{b['speedup']:.2f}x",
                         "met" if b["speedup"] >= 5 else "missed"])
    for name, h in res.get("startup", {}).items():
        rows.append([f"`mergepipe {name}` < 0.5 s", f"{h['wall_s']:.2f} s ({h['modules']} "
                     "modules)", "met" if h["wall_s"] < 0.5 else "missed"])
    if "ingestion" in res:
        g = res["ingestion"]
        limit = 1.5 * g["cat_s"] + 1.0
        rows.append(["ingest (start-up included) <= 1.5x `cat` of expert and base + 1 s",
                     f"{_s(g['process_s'])} against {_s(limit)} (cat {_s(g['cat_s'])})",
                     "met" if g["process_s"] <= limit else "missed"])
    if "one_d" in res:
        o = res["one_d"]
        rows.append([f"ingestion peak RSS < 1 GiB with a {o['tensor_mib']} MiB 1-D tensor",
                     f"expert {_mib(o['expert_peak_rss'])}, base {_mib(o['base_peak_rss'])}",
                     "met" if max(o["expert_peak_rss"], o["base_peak_rss"]) < 2**30
                     else "missed"])
    return rows


def render(res: dict[str, Any], table: Any) -> str:
    """Section 8 of the report: the extra figures, each with its command."""
    parts = ["## 9. K = 16, start-up, ingestion, and where a budgeted merge's time goes\n"]
    if res.get("big_k"):
        parts += ["Budgeted merges at K = 16 against mergekit's full merge (same protocol as "
                  "figure 3):\n",
                  table(["operator", "K", "budget", "expert bytes", "mergekit", "ours",
                         "speedup"],
                        [[b["operator"], b["k"], b["budget"], f"{b['expert_bytes'] / 1e6:,.0f} MB",
                          _s(b["mergekit_s"]), _s(b["ours_s"]), f"{b['speedup']:.2f}x"]
                         for b in res["big_k"]])]
    if res.get("commands"):
        parts.append(whole_commands.render(res["commands"], table))
    if res.get("phases"):
        parts += ["Where the time of each budgeted merge of figure 3 goes (medians): planning; "
                  "the block loop (reads, merge, writes, the output's statistics, fsync); "
                  "publishing and registering the output; the rest of the call (catalog open, "
                  "submitting the merge):\n",
                  table(["operator", "K", "budget", "merge", "planning", "block loop",
                         "publish + register", "rest", "expert + base bytes read"],
                        [[p["operator"], p["k"], p["budget"], _s(p["merge_s"]), _s(p["plan_s"]),
                          _s(p["exec_s"]), _s(p["register_s"]), _s(p["other_s"]),
                          f"{(p['expert_bytes'] + p['base_bytes']) / 1e6:,.0f} MB"]
                         for p in res["phases"]])]
    for name, h in res.get("startup", {}).items():
        parts.append(f"`mergepipe {name}` in a fresh interpreter (`python -m "
                     f"mergepipe_bench.startup`): {_s(h['wall_s'])} wall, "
                     f"{_s(h['cpu_s'])} CPU, {h['modules']} modules imported (medians).\n")
    if "ingestion" in res:
        g = res["ingestion"]
        parts.append(f"`mergepipe ingest --json` of one expert with statistics ({g['expert_bytes'] / 1e6:,.0f} MB; "
                     f"the statistics pass reads the expert and its base, {g['read_bytes'] / 1e6:,.0f} MB), "
                     f"the command in a fresh process on a cold cache: {_s(g['process_s'])} start to exit, of "
                     f"which {_s(g['ingest_s'])} ingesting; `cat` of the same files "
                     f"{_s(g['cat_s'])}; peak RSS {_mib(g['peak_rss'])} (medians).\n")
    if "one_d" in res:
        o = res["one_d"]
        parts.append(f"A checkpoint with one float32 1-D tensor of {o['tensor_mib']} MiB: "
                     f"ingesting the base peaks at {_mib(o['base_peak_rss'])} RSS, the expert "
                     f"with statistics at {_mib(o['expert_peak_rss'])} (child processes; the "
                     "tensor is cut into element-range blocks).\n")
    return "\n".join(parts)
