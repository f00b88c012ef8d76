"""Time make_plan on a synthetic catalog of many blocks (`python -m
mergepipe_bench.planner_bench`), or, given the catalog of a real family (--catalog, --base,
--experts, --out), the planning share of budgeted merges of it: the merge's plan_seconds (the
plan and its check against the files) over its wall time, next to make_plan alone."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.request import build_request
from mergepipe.planner.plan import make_plan

# Synthetic rows, generated inside the database. Sizes are bound parameters; names are fixed.
_MODELS = SQL(
    "INSERT INTO models (name, kind, path, base, status, has_stats, block_bytes, n_tensors, "
    "tensor_bytes) SELECT CASE WHEN i = 0 THEN 'base' ELSE 'e' || i END, 'full', '/synthetic', "
    "CASE WHEN i = 0 THEN NULL ELSE 'base' END, 'ready', i > 0, CAST(:block_bytes AS BIGINT), :n_tensors, "
    "CAST(:n_tensors AS BIGINT) * :per_tensor * :block_bytes FROM range(0, :k + 1) AS r(i)")
_TENSORS = SQL(
    "INSERT INTO tensors (model, tensor, ordinal, file_index, dtype, shape, data_offset, nbytes, "
    "n_blocks) SELECT m.name, 't' || t, t, 0, 'BF16', [:per_tensor, :block_bytes // 2], "
    "CAST(t AS BIGINT) * :per_tensor * :block_bytes, CAST(:per_tensor AS BIGINT) * :block_bytes, :per_tensor "
    "FROM models m, range(0, :n_tensors) AS r(t)")
_BLOCKS = SQL(
    "INSERT INTO blocks (model, tensor, block_index, row_start, row_end, file_index, byte_offset, "
    "nbytes, content_hash) SELECT t.model, t.tensor, b, b, b + 1, 0, t.data_offset + CAST(b AS BIGINT) * "
    ":block_bytes, :block_bytes, md5(t.model || t.tensor || b) "
    "FROM tensors t, range(0, :per_tensor) AS r(b)")
_BLOCK_STATS = SQL(
    "INSERT INTO block_stats (model, tensor, block_index, l2, l1, max_abs, nnz) "
    "SELECT model, tensor, block_index, h, h * 100, h / 10, 100 FROM (SELECT model, tensor, "
    "block_index, (hash(content_hash) % 1000000) / 1e6 AS h FROM blocks WHERE model <> 'base')")
_TENSOR_STATS = SQL(
    "INSERT INTO tensor_stats (model, tensor, numel, l2, l1, max_abs, nnz, trim_tau, trim_above, "
    "trim_tied) SELECT model, tensor, nbytes // 2, 1, 1, 1, nbytes // 2, "
    ":tau, :above, :tied FROM tensors WHERE model <> 'base'")


def build(cat: Catalog, k: int, blocks_per_expert: int, block_bytes: int = 1 << 20,
          n_tensors: int = 200) -> None:
    """K experts of `blocks_per_expert` equal blocks each (n_tensors tensors) and their base."""
    p = {"k": k, "n_tensors": n_tensors, "per_tensor": blocks_per_expert // n_tensors,
         "block_bytes": block_bytes}
    with cat.transaction() as conn:
        for stmt in (_MODELS, _TENSORS, _BLOCKS, _BLOCK_STATS):
            conn.execute(stmt, p)
        # trim_tau[j] decreasing with density (j / 1000), so ties at density 0.5 drops some blocks
        conn.execute(_TENSOR_STATS, {"tau": [(99 - j) / 1000 for j in range(100)],
                                     "above": list(range(100)), "tied": [1] * 100})


def merge_shares(catalog: str, base: str, experts: str, out: Path, repeat: int,
                 budget: float = 0.1) -> list[dict[str, Any]]:
    """Budget-`budget` linear and ties merges of a registered family, each `repeat` times (the
    first run warms the page cache and the imports, and is not counted): median make_plan
    seconds, plan_seconds and wall seconds of the merge, and the planning share."""
    from mergepipe.jobs.merge import merge

    rows = []
    with Catalog(catalog) as cat:
        for op, params in (("linear", {}), ("ties", {"density": 0.5})):
            req = build_request(base=base, experts=experts, operator=op, params=params,
                                budget=budget)
            plans, planned, walls = [], [], []
            for i in range(repeat + 1):
                plan_s = make_plan(cat, req).planning_seconds
                s = merge(cat, req, out / f"{op}-{i}", output_name=f"planner-bench-{op}-{i}",
                          overwrite=True)
                if i:
                    plans.append(plan_s)
                    planned.append(s.plan_seconds or 0.0)
                    walls.append(s.wall_seconds)
            wall = statistics.median(walls)
            rows.append({"operator": op, "budget": budget,
                         "make_plan_s": statistics.median(plans),
                         "plan_s": statistics.median(planned), "merge_wall_s": wall,
                         "share": statistics.median(planned) / wall if wall else 0.0})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--catalog", help="the catalog of a registered family (with --base, "
                    "--experts as names, --out): time budget-0.1 merges of it")
    ap.add_argument("--base", help="with --catalog: the base model's name")
    ap.add_argument("--out", type=Path, help="with --catalog: where the merges are written")
    ap.add_argument("--experts", default="16", help="expert count of the synthetic catalog; "
                    "with --catalog: the experts' names, comma-separated")
    ap.add_argument("--blocks", type=int, default=20_000, help="blocks per expert")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.catalog:
        if not args.base or not args.out:
            ap.error("--catalog needs --base, --experts (names) and --out")
        for r in merge_shares(args.catalog, args.base, args.experts, args.out, args.repeat):
            print(f"{r['operator']:7s} budget {r['budget']:4.2f}: make_plan {r['make_plan_s']:.3f}"
                  f" s, merge plan_seconds {r['plan_s']:.3f} s of {r['merge_wall_s']:.3f} s "
                  f"wall: planning share {100 * r['share']:.1f}%")
        return
    if not args.experts.isdigit():
        ap.error("--experts: a number of synthetic experts (names only with --catalog)")
    k = int(args.experts)
    with tempfile.TemporaryDirectory() as d, Catalog(Path(d) / "bench.duckdb") as cat:
        t0 = time.perf_counter()
        build(cat, k, args.blocks)
        print(f"catalog: {k} experts x {args.blocks} blocks "
              f"({time.perf_counter() - t0:.1f} s to build)")
        experts = ",".join(f"e{i}" for i in range(1, k + 1))
        for op, params in (("linear", {}), ("ties", {"density": 0.5})):
            for budget in (0.1, 0.5, 1.0):
                req = build_request(base="base", experts=experts, operator=op, params=params,
                                    budget=budget)
                times, cpu = [], []
                for _ in range(args.repeat):
                    c0 = time.process_time()
                    plan = make_plan(cat, req)
                    cpu.append(time.process_time() - c0)
                    times.append(plan.planning_seconds)
                print(f"{op:7s} budget {budget:4.2f}: {len(plan.blocks):7d} of "
                      f"{plan.candidate_blocks} blocks, wall median {statistics.median(times):.3f}"
                      f" s (min {min(times):.3f}), process CPU median "
                      f"{statistics.median(cpu):.3f} s")


if __name__ == "__main__":
    main()
