"""The large family's planning, without its 15 GB: `python -m mergepipe_bench.planning_rows
--work DIR [--reps 7] [--reuse]`.

A copy of `large_family.SHAPE` with every dimension divided by SCALE (16) and ingested with
blocks SCALE^2 times smaller (4 KiB) has the same tensors and the same block grid (1,659 blocks a
model, 14,931 in all; 13,272 with statistics), so the catalog the planner reads has the large
family's row counts while the checkpoints take 60 MB. Per operator of the row (budget-0.1 linear
and ties), medians of `reps` runs on one catalog copy, wall and process CPU:

* accept: `check_inputs`, the checks before a merge is queued;
* inputs: `read_inputs`, the models' catalog rows the plan does not change, and the vocabulary
  check on them; plan: `choose_plan`; prepare: the executor's check of the plan against the
  catalog and files; each timed alone, in turn;
* plan_seconds: `plan_and_prepare`, what a merge reports as `plan_seconds` (everything before
  its first read): the three above, the inputs read on a second connection while the planner
  runs.
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
from mergepipe.catalog.ingest import ingest_model
from mergepipe.cli.family import LlamaShape, generate_family, read_family
from mergepipe.core.request import build_request
from mergepipe.executor.prepare import prepare, read_inputs
from mergepipe.jobs.merge import plan_and_prepare
from mergepipe.jobs.planning import check_inputs, check_vocab_rows
from mergepipe.planner.incremental import choose_plan
from mergepipe.storage.grid import DEFAULT_BLOCK_BYTES
from mergepipe_bench.large_family import BUDGET, EXPERTS, OPERATORS, SEED, SHAPE

SCALE = 16


def scaled(shape: LlamaShape = SHAPE, scale: int = SCALE) -> LlamaShape:
    """`shape` with hidden, intermediate and vocab divided by `scale` (same tensors)."""
    return LlamaShape(hidden=shape.hidden // scale, intermediate=shape.intermediate // scale,
                      layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads,
                      vocab=shape.vocab // scale)


def setup(work: Path, *, shape: LlamaShape | None = None, experts: int = EXPERTS,
          block_bytes: int = DEFAULT_BLOCK_BYTES // SCALE ** 2) -> tuple[Path, list[str]]:
    """Generate and ingest the scaled family under `work`; its catalog and expert names."""
    root = work / "family-scaled"
    shutil.rmtree(root, ignore_errors=True)
    generate_family(root, experts=experts, shape=shape or scaled(), seed=SEED)
    catalog = root / "catalog.duckdb"
    names = [e["name"] for e in read_family(root)["experts"]]
    with Catalog(catalog) as cat:
        ingest_model(cat, root / "base", "base", block_bytes=block_bytes)
        for n in names:
            ingest_model(cat, root / n, n, base="base")
    return catalog, names


def measure(catalog: Path, experts: list[str], reps: int) -> list[dict[str, Any]]:
    """Medians of `reps` accept / inputs / plan / prepare runs per operator (after one
    warm-up)."""
    rows = []
    with Catalog(catalog) as cat:
        for op, params in OPERATORS:
            req = build_request(base="base", experts=",".join(experts), operator=op,
                                params=params, budget=BUDGET)
            prepare(cat, choose_plan(cat, check_inputs(cat, req)))  # warm-up
            runs: dict[str, list[float]] = {}
            for _ in range(reps):
                marks = [(time.perf_counter(), time.process_time())]
                pinned = check_inputs(cat, req)
                marks.append((time.perf_counter(), time.process_time()))
                inputs = read_inputs(cat, [pinned.base, *(e.model for e in pinned.experts)])
                check_vocab_rows(pinned, inputs)
                marks.append((time.perf_counter(), time.process_time()))
                plan = choose_plan(cat, pinned)
                marks.append((time.perf_counter(), time.process_time()))
                prepare(cat, plan, inputs)
                marks.append((time.perf_counter(), time.process_time()))
                plan = plan_and_prepare(cat, pinned).plan
                marks.append((time.perf_counter(), time.process_time()))
                for i, phase in enumerate(("accept", "inputs", "plan", "prepare",
                                           "plan_seconds")):
                    runs.setdefault(f"{phase}_s", []).append(marks[i + 1][0] - marks[i][0])
                    runs.setdefault(f"{phase}_cpu_s", []).append(marks[i + 1][1] - marks[i][1])
            rows.append({"operator": op, "budget": BUDGET, "runs": reps,
                         "plan_hash": plan.plan_hash, "blocks": len(plan.blocks),
                         **{k: statistics.median(v) for k, v in runs.items()}})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="where the family is written")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--reuse", action="store_true", help="measure the family already in --work "
                    "(e.g. with another version of the product on PYTHONPATH)")
    args = ap.parse_args(argv)
    root = args.work / "family-scaled"
    if args.reuse and (root / "catalog.duckdb").exists():
        catalog = root / "catalog.duckdb"
        experts = [e["name"] for e in read_family(root)["experts"]]
    else:
        catalog, experts = setup(args.work)
    for r in measure(catalog, experts, args.reps):
        print(json.dumps(r))
        print(f"{r['operator']:7s}: plan_seconds {r['plan_seconds_s']:.3f} s wall, "
              f"{r['plan_seconds_cpu_s']:.3f} s CPU (in turn: inputs {r['inputs_s']:.3f} + plan "
              f"{r['plan_s']:.3f} + prepare {r['prepare_s']:.3f} s wall); acceptance "
              f"{r['accept_s']:.3f} s wall")


if __name__ == "__main__":
    main()
