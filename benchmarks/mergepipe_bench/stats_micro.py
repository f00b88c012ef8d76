"""Microbenchmark of the delta statistics pass: one block's stats and a tensor's threshold finishing.

`python -m mergepipe_bench.stats_micro [--mib 64] [--runs 5]` builds a float32 |delta| of
`mib` MiB from a bf16 base and expert (the shape of ingestion's and registration's deltas), and
prints one JSON object: median wall and CPU milliseconds of `scan_block` plus the level-0
`finish_level` of that block as a tensor, of `finish_level` alone, of `solve_sorted` of a
64 Ki-element one-block tensor, and the load average. numpy and the C pass: no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from mergepipe.catalog.stats import Scratch, TrimThresholds, scan_block


def abs_delta(numel: int, seed: int = 0) -> np.ndarray:
    """|expert - base| in float32 of a bf16 base (std 0.02) and a bf16 expert (+ std 0.002)."""
    rng = np.random.default_rng(seed)
    base = _bf16(rng.standard_normal(numel, dtype=np.float32) * np.float32(0.02))
    expert = _bf16(base + rng.standard_normal(numel, dtype=np.float32) * np.float32(0.002))
    return np.abs(expert - base)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest even; finite values), as float32."""
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def _median_ms(fn: Callable[[], float | None], runs: int) -> dict[str, float]:
    walls, cpus, inner = [], [], []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        part = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
        if part is not None:
            inner.append(part)
    out = {"wall_ms": statistics.median(walls) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3}
    if inner:
        out["finish_level_ms"] = statistics.median(inner) * 1e3
    return {k: round(v, 2) for k, v in out.items()}


def run(mib: int, runs: int) -> dict[str, object]:
    a, small, scratch = abs_delta(mib << 18), abs_delta(1 << 16, 1), Scratch()

    def block() -> float:
        stats, counts, mixed = scan_block(a, scratch, collect_mixed=True)
        trim = TrimThresholds(a.size)
        trim.add(counts)
        trim.add_mixed(mixed)
        t = time.perf_counter()
        trim.finish_level()
        return time.perf_counter() - t

    def solve() -> None:
        TrimThresholds(small.size).solve_sorted(small)

    return {"block_mib": mib, "runs": runs, "scan_block_and_finish": _median_ms(block, runs),
            "solve_sorted_64ki": _median_ms(solve, max(runs, 11)),
            "load": [round(x, 1) for x in os.getloadavg()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    print(json.dumps(run(args.mib, args.runs)))


if __name__ == "__main__":
    main()
