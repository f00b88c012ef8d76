"""Time make_plan on a synthetic catalog of many blocks: `python -m planner.bench`."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=20_000, help="blocks per expert")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d, Catalog(Path(d) / "bench.duckdb") as cat:
        t0 = time.perf_counter()
        build(cat, args.experts, args.blocks)
        print(f"catalog: {args.experts} experts x {args.blocks} blocks "
              f"({time.perf_counter() - t0:.1f} s to build)")
        experts = ",".join(f"e{i}" for i in range(1, args.experts + 1))
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
