"""`mergepipe bench`: the benchmark suite (ours vs mergekit vs cat on a cold page cache)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="run the benchmark suite and write BENCHMARKS.md with plots",
        description="Generate a checkpoint family, ingest it, and time merges against mergekit "
        "and against cat/dd of the same bytes, each on a cold page cache (medians of several "
        "runs). Needs mergekit (pip install mergekit) and matplotlib for the plots.")
    from mergepipe.benchmarks.cli_args import add_arguments
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.requires import require

    if not args.large:  # the large-family row times mergepipe alone
        require({"mergekit": "pip install 'mergekit==0.1.5' (or mergepipe[test])"},
                "the suite times mergekit beside mergepipe")
    from mergepipe.benchmarks.run import run_from_args
    return run_from_args(args)
