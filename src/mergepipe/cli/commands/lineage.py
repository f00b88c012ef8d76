"""`mergepipe lineage NAME`: what a model was merged from, and what was merged from it."""

from __future__ import annotations

import argparse

from mergepipe.cli.main import print_json
from mergepipe.cli.table import print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lineage", help="a model's ancestors and descendants",
        description="The merges a model came from (its ancestors: bases, experts, passthrough "
                    "slices' sources, reused merges) and the models merged from it, each edge "
                    "with its role, weight, merge id and depth.")
    p.add_argument("name", help="a model name (NAME~N: one version)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, beside_server=True)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.beside import open_catalog

    with open_catalog(args) as cat:
        tree = cat.lineage(args.name)
    if args.json:
        print_json(tree)
        return 0
    for title, edges in (("ancestors", tree.ancestors), ("descendants", tree.descendants)):
        print(f"{title} of {args.name}:")
        print_table(["depth", "child", "parent", "role", "weight", "merge"],
                    [[e.depth, e.child, e.parent, e.role, e.weight, e.merge_id] for e in edges])
    return 0
