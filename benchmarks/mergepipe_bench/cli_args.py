"""The options of `mergepipe bench` (kept free of heavy imports so `--help` stays fast)."""

from __future__ import annotations

import argparse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition (CI)")
    ap.add_argument("--large", action="store_true",
                    help="only the large-family row: K=8 experts of 1.67 GB (bf16, hidden 2048, "
                    "16 layers), budget-0.1 linear and ties merges, planning share of each; "
                    "generates the family once under OUT/work/family-large (about 15 GB of "
                    "disk); writes OUT/large-family.md and .json (no mergekit needed)")
    ap.add_argument("--out", default="bench-output",
                    help="work directory: families, catalogs, logs, results.json (default "
                    "bench-output; a family generated there before is reused)")
    ap.add_argument("--reps", type=int, help="repetitions per configuration (default 3; quick 1)")
    ap.add_argument("--size-mb", type=float, help="checkpoint size (default 200; quick 1)")
    ap.add_argument("--report", help="where to write BENCHMARKS.md (default OUT/BENCHMARKS.md)")
    ap.add_argument("--plots", help="directory for the PNG plots (default: beside the report)")
