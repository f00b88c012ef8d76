"""The five figures of the suite, computed from measured samples (medians over repetitions)."""

from __future__ import annotations

import datetime
import math
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from mergepipe_bench.coldcache import make_cold
from mergepipe_bench.deviation import l2_distance, relative_l2
from mergepipe_bench.suite import Run, Suite
from mergepipe_bench.worker import WorkerClient


def fixed_budget_bytes(suite: Suite) -> int:
    """Scaling figure's fixed budget: a share of the full read of the scaling operator at k_main."""
    from mergepipe.catalog.db import Catalog
    from mergepipe.core.request import build_request
    from mergepipe.planner.plan import make_plan

    cfg = suite.cfg
    req = build_request(**suite.request(Run("ours", cfg.scaling_operator, cfg.k_main)))
    with Catalog(suite.catalogs["main"]) as cat:
        full = make_plan(cat, req).full_read_bytes
    return math.floor(cfg.fixed_budget_share * full)


def _ours(suite: Suite, run: Run) -> dict[str, Any]:
    """Medians of one of our configurations: times, counted bytes, disk bytes."""
    s = suite.samples[run.key]
    first = s[0].result["summary"]
    return {"merge_s": suite.median(run), "exec_s": suite.median_result(run, "summary.exec_seconds"),
            "plan_s": suite.median_result(run, "summary.plan_seconds"),
            "expert_bytes": first["expert_bytes_read"], "base_bytes": first["base_bytes_read"],
            "full_read_bytes": first["full_read_bytes"], "budget_bytes": first["budget_bytes"],
            "expert_blocks": first["expert_blocks_read"],
            "disk_expert_bytes": statistics.median(x.disk_expert_bytes for x in s),
            "runs": [round(x.merge_s, 3) for x in s]}


def _mergekit(suite: Suite, run: Run) -> dict[str, Any]:
    s = suite.samples[run.key]
    return {"merge_s": suite.median(run),
            "disk_expert_bytes": statistics.median(x.disk_expert_bytes for x in s),
            "disk_base_bytes": statistics.median(x.disk_base_bytes for x in s),
            "runs": [round(x.merge_s, 3) for x in s]}


def scaling(suite: Suite, runs: list[Run]) -> list[dict[str, Any]]:
    """Figure 1: expert bytes and time vs K for mergekit, our full read, ours at fixed bytes."""
    rows = []
    for k in suite.cfg.ks:
        mk, full, fixed = (r for r in runs if r.k == k)
        rows.append({"k": k, "operator": mk.op, "mergekit": _mergekit(suite, mk),
                     "ours_full": _ours(suite, full), "ours_fixed": _ours(suite, fixed)})
    return rows


def operators(suite: Suite, runs: list[Run]) -> list[dict[str, Any]]:
    """Figure 3: each operator at k_main, mergekit vs our full read vs our low budget."""
    rows = []
    for i in range(0, len(runs), 3):
        mk, full, low = runs[i:i + 3]
        m, f, lo = _mergekit(suite, mk), _ours(suite, full), _ours(suite, low)
        rows.append({"operator": mk.op, "k": mk.k, "low_budget": low.budget, "mergekit": m,
                     "ours_full": f, "ours_low": lo,
                     "speedup_full": m["merge_s"] / f["merge_s"],
                     "speedup_low": m["merge_s"] / lo["merge_s"],
                     "ours_vs_mergekit_rel_l2": relative_l2(suite.output(full),
                                                            suite.output(mk)),
                     "low_vs_full_rel_l2": relative_l2(suite.output(low), suite.output(full))})
    return rows


def sweep(suite: Suite, runs: list[Run]) -> list[dict[str, Any]]:
    """Figure 2: budget sweep per operator: bytes, touched blocks, time, deviation from full."""
    rows = []
    for op in suite.cfg.sweep_operators:
        mine = [r for r in runs if r.op == op]
        full = next(r for r in mine if r.budget == "full")
        full_blocks = _ours(suite, full)["expert_blocks"]
        for r in mine:
            o = _ours(suite, r)
            dist, norm = l2_distance(suite.output(r), suite.output(full))
            bound = suite.first(r)["summary"].get("omission_bound")
            rows.append({"operator": op, "budget": 1.0 if r.budget == "full" else
                         float(r.budget[2:]), **o,
                         "touched_ratio": o["expert_blocks"] / full_blocks if full_blocks else 0,
                         "rel_l2": dist / norm if norm else 0.0, "abs_l2": dist,
                         "omission_bound": bound})
    return rows


def overheads(suite: Suite, op_runs: list[Run], rss_runs: list[Run]) -> dict[str, Any]:
    """Figure 4: planning share, manifest and catalog sizes, peak RSS vs model size."""
    planning = []
    for r in op_runs:
        if r.tool != "ours":
            continue
        s = suite.samples[r.key]
        planning.append({"operator": r.op, "budget": r.budget,
                         "plan_s": suite.median_result(r, "summary.plan_seconds"),
                         "exec_s": suite.median_result(r, "summary.exec_seconds"),
                         "merge_s": suite.median(r),
                         "manifest_bytes": s[0].result["manifest_bytes"]})
    for p in planning:
        p["plan_share"] = p["plan_s"] / p["exec_s"] if p["exec_s"] else math.nan
    catalogs = [{"family": n, "catalog_bytes": i["catalog_bytes"],
                 "checkpoint_bytes": i["family_bytes"],
                 "share": i["catalog_bytes"] / i["family_bytes"]}
                for n, i in suite.setup_info.items()]
    rss = [{"family": r.family, "tool": r.tool, "operator": r.op, "k": r.k,
            "checkpoint_bytes": suite.setup_info[r.family]["checkpoint_bytes"],
            **_one_shot(suite, r)} for r in rss_runs]
    return {"planning": planning, "catalogs": catalogs, "rss": rss, "imports": suite.imports}


def _one_shot(suite: Suite, run: Run) -> dict[str, Any]:
    """One merge in a fresh worker process (cold cache): the process's peak RSS (VmHWM
    since exec: interpreter, imports and the merge) and its wall time from start to exit."""
    rundir = suite.work / "runs" / ("rss-" + run.key.replace("/", "_"))
    shutil.rmtree(rundir, ignore_errors=True)
    rundir.mkdir(parents=True)
    job, inputs = suite.job(run, rundir)
    make_cold(inputs)
    t0 = time.perf_counter()
    with WorkerClient(run.tool, suite.out / "logs" / f"rss-{run.tool}.log") as w:
        result = w.run({**job, "reset_peak": False})
        import_s, idle_rss = w.import_s, w.idle_rss
    wall = time.perf_counter() - t0
    shutil.rmtree(rundir)
    suite.log(f"  fresh process {run.key}: peak RSS {result['peak_rss'] / 2**20:.0f} MiB, "
              f"{wall:.1f} s")
    return {"peak_rss": result["peak_rss"], "idle_rss": idle_rss, "process_s": wall,
            "import_s": import_s, "merge_s": result["merge_s"]}


def physical(suite: Suite, run_physical: Callable[..., Any],
             run_ranges: Callable[..., Any]) -> list[dict[str, Any]]:
    """Figure 5: cat/dd of exactly the bytes our full-read merges read and write, vs ours.

    Side by side: each repetition runs `cat`/`dd` and one more cold full-read merge of ours,
    in alternating order, so that both see the same state of the machine (the VM's disk has a
    host-side cache that a guest's eviction does not reach: `cat` of the same bytes varied 2x
    between rows measured minutes apart)."""
    from mergepipe.catalog.db import Catalog

    cfg = suite.cfg
    rows = []
    for op in ("linear", "ties"):
        run = Run("ours", op, cfg.k_main)
        if run.key not in suite.samples:
            continue
        first = suite.first(run)
        with Catalog(suite.keep[run.key] / "catalog.duckdb") as cat:
            experts, base = run_ranges(cat, first["summary"]["merge_id"], "base")
        times, merges = [], []
        nread = 0
        for rep in range(cfg.reps):
            for step in ("cat", "ours") if rep % 2 == 0 else ("ours", "cat"):
                if step == "ours":
                    merges.append(suite.measure(run, cfg.reps + rep))
                    continue
                make_cold([suite.families["main"]])
                timed, nread = run_physical(experts + base, first["output_bytes"],
                                            suite.work / "runs" / f"cat-{op}-{rep}")
                times.append(timed.wall_s)
        cat_s = statistics.median(times)
        merge_s = statistics.median(m.merge_s for m in merges)
        exec_s = statistics.median(float(m.result["summary"]["exec_seconds"]) for m in merges)
        ours = {**_ours(suite, run), "merge_s": merge_s, "exec_s": exec_s,
                "runs": [round(m.merge_s, 3) for m in merges]}
        rows.append({"operator": op, "k": cfg.k_main, "cat_s": cat_s, "cat_runs": times,
                     "cat_read_bytes": nread,
                     "ranges_expert_bytes": sum(r.nbytes for r in experts),
                     "ranges_base_bytes": sum(r.nbytes for r in base),
                     "write_bytes": first["output_bytes"], **ours,
                     "ratio_merge": merge_s / cat_s, "ratio_exec": exec_s / cat_s})
        suite.log(f"  cat/dd {op}: {cat_s:.2f} s; ours {merge_s:.2f} s, paired")
    suite.close()
    return rows


def code_version() -> str:
    """The engine's commit, and the engine files with uncommitted changes when measured."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "catalog", "storage", "planner", "executor", "core", "jobs"],
                               cwd=repo,
                               check=True, capture_output=True, text=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" with uncommitted changes to {', '.join(changed)}" if changed else "")


def machine(where: Path) -> dict[str, Any]:
    """CPU model, cores, RAM, disk, OS and package versions, date."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    disk = ""
    try:
        dev = subprocess.run(["df", "--output=source", str(where)], capture_output=True,
                             text=True, check=True).stdout.split()[-1]
        name = os.path.basename(dev).rstrip("0123456789")
        rot = Path(f"/sys/block/{name}/queue/rotational")
        kind = ("rotational" if rot.read_text().strip() == "1" else "non-rotational") \
            if rot.exists() else "unknown type"
        disk = f"{dev} ({kind}), {shutil.disk_usage(where).total / 1e9:.0f} GB"
    except (OSError, subprocess.CalledProcessError, IndexError):
        pass
    versions: dict[str, str | None] = {}
    for pkg in ("torch", "mergekit", "duckdb", "safetensors"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
            "code": code_version(),
            "disk": disk, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "versions": versions,
            "load_avg_start": os.getloadavg(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}
