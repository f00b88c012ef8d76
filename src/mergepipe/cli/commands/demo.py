"""`mergepipe demo`: the README's main job, end to end, on a generated family."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate a family, serve, merge on a budget, report")
    p.add_argument("--dir", default="demo-output", help="folder for everything the demo makes "
                   "(default: ./demo-output; replaced if it exists)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.demo import run_demo
    return run_demo(Path(args.dir).absolute())
