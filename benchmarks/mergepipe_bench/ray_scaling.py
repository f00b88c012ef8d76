"""Merge throughput of the Ray engine with 1 and 2 Ray worker CPUs (and the local engine beside it).

    python -m mergepipe_bench.ray_scaling [--root /tmp/mergepipe-ray-bench] [--size-mb 100]
                                               [--experts 4] [--shards 4] [--op ties]
                                               [--budget 1.0] [--repeats 3]

Generates (once) a bf16 Llama-shaped family (benchmarks.family) under --root and ingests it into a
DuckDB catalog there, plans one merge, then executes that plan with the local engine and, for
each worker count, on a fresh local Ray runtime started with that many CPUs (one warm-up run:
worker processes and their imports; then --repeats timed runs, the median kept). Throughput is
the bytes read (expert + base) over the execution's wall time, on a warm page cache. Every run's
output hash must equal the local engine's. On the same runtimes it also times the statistics
scan of the first expert's ingestion (catalog.ingest.scan_model: every row computed, none
written; on Ray one task per shard file), whose rows must equal the local scan's. Prints a table
and writes ray_scaling.json in --root.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ScannedModel, ingest_model, scan_model
from mergepipe.cli.family import generate_family
from mergepipe.core.request import build_request
from mergepipe.executor.engine import Engine
from mergepipe.jobs.merge import execute_plan
from mergepipe.planner.plan import Plan, make_plan

MODULE = "mergepipe_bench.ray_scaling"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=MODULE, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="/tmp/mergepipe-ray-bench")
    p.add_argument("--size-mb", type=float, default=100.0)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--op", default="ties")
    p.add_argument("--budget", default="1.0")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", default="1,2", help="Ray worker CPUs to try, comma-separated")
    args = p.parse_args(argv)
    root = Path(args.root).absolute()
    cat = _family_catalog(root, args)
    try:
        req = build_request(base="base", experts=",".join(f"expert-{i:02d}"
                                                          for i in range(args.experts)),
                            operator=args.op, budget=args.budget, params={"density": 0.5})
        plan = make_plan(cat, req)
        rows = [_measure(cat, plan, root, "local", None, args.repeats)]
        rows += [_measure(cat, plan, root, "ray", int(w), args.repeats)
                 for w in args.workers.split(",")]
    finally:
        cat.close()
    local_rows = rows[0]["scan_rows"]
    for r in rows:
        if r["output_hash"] != rows[0]["output_hash"]:
            raise SystemExit(f"{r['engine']} x{r['workers']}: output hash differs from local")
        if r.pop("scan_rows") != local_rows:
            raise SystemExit(f"{r['engine']} x{r['workers']}: ingestion rows differ from local")
    ray1 = next((r for r in rows if r["engine"] == "ray" and r["workers"] == 1), None)
    print(f"{'engine':8} {'workers':>7} {'median s':>9} {'MB/s':>8} {'vs ray x1':>9} "
          f"{'ingest s':>9} {'vs ray x1':>9}")
    for r in rows:
        ratio = ray1["median_s"] / r["median_s"] if ray1 else float("nan")
        ingest = ray1["ingest_median_s"] / r["ingest_median_s"] if ray1 else float("nan")
        r["speedup_vs_ray1"], r["ingest_speedup_vs_ray1"] = round(ratio, 3), round(ingest, 3)
        print(f"{r['engine']:8} {r['workers'] or '-':>7} {r['median_s']:9.2f} "
              f"{r['mb_per_s']:8.1f} {ratio:9.2f} {r['ingest_median_s']:9.2f} {ingest:9.2f}")
    (root / "ray_scaling.json").write_text(json.dumps(
        {"size_mb": args.size_mb, "experts": args.experts, "shards": args.shards,
         "op": args.op, "budget": args.budget, "rows": rows}, indent=2))
    return 0


def _family_catalog(root: Path, args: argparse.Namespace) -> Catalog:
    """The family under root/family, ingested into root/catalog.duckdb (both made once)."""
    fam, db = root / "family", root / "catalog.duckdb"
    if not (fam / "family.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        generate_family(fam, experts=args.experts, size_mb=args.size_mb, shards=args.shards)
    fresh = not db.exists()
    cat = Catalog(db)
    if fresh:
        ingest_model(cat, fam / "base", "base")
        for i in range(args.experts):
            ingest_model(cat, fam / f"expert-{i:02d}", f"expert-{i:02d}", base="base")
    return cat


def _measure(cat: Catalog, plan: Plan, root: Path, engine: str, workers: int | None,
             repeats: int) -> dict[str, Any]:
    """Median execution time of the plan on an engine (Ray: a runtime of `workers` CPUs)."""
    if engine == "ray":
        import ray  # only when measured

        ray.init(num_cpus=workers, include_dashboard=False, object_store_memory=128 << 20,
                 log_to_driver=False)
    try:
        times, summary = [], None
        for i in range(repeats + 1):  # the first run warms up (Ray: worker start-up)
            out = root / "out"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            summary = execute_plan(cat, plan, out, engine=Engine(engine))
            if i:
                times.append(time.perf_counter() - t0)
        shutil.rmtree(root / "out", ignore_errors=True)
        scan_s, scanned = _time_scan(cat, root, Engine(engine), repeats)
    finally:
        if engine == "ray":
            ray.shutdown()
    assert summary is not None
    med = statistics.median(times)
    nbytes = summary.expert_bytes_read + summary.base_bytes_read
    return {"engine": engine, "workers": workers, "median_s": round(med, 3),
            "runs_s": [round(t, 3) for t in times], "bytes_read": nbytes,
            "mb_per_s": round(nbytes / med / 1e6, 1), "output_hash": summary.output_hash,
            "ingest_median_s": round(statistics.median(scan_s), 3),
            "ingest_runs_s": [round(t, 3) for t in scan_s],
            "scan_rows": (scanned.blocks, scanned.block_stats, scanned.tensor_stats)}


def _time_scan(cat: Catalog, root: Path, engine: Engine, repeats: int
               ) -> tuple[list[float], ScannedModel]:
    """Times of the first expert's ingestion scan (after one warm-up run) and its rows."""
    times, scanned = [], None
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        scanned = scan_model(cat, root / "family" / "expert-00", "scan-probe", base="base",
                             scan=engine.ingest_scan())
        if i:
            times.append(time.perf_counter() - t0)
    assert scanned is not None
    return times, scanned


if __name__ == "__main__":
    raise SystemExit(main())
