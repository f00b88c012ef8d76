"""`mergepipe models`: list the registered models."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from mergepipe.cli.main import print_json
from mergepipe.cli.table import human_bytes, print_table

if TYPE_CHECKING:
    from mergepipe.catalog.models import ModelRow

# rel_delta: ||E - B|| / ||B|| of an expert (a fine-tune: about 0.001 to 0.1; docs/catalog.md)
COLUMNS = ["name", "kind", "base", "status", "stats", "rel_delta", "tensors", "size", "block",
           "ingest_s", "version", "path"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the registered models (the latest version of "
                       "each name; removed ones are left out)")
    p.add_argument("--json", action="store_true", help="print a JSON list of model objects")
    p.set_defaults(func=run, beside_server=True)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.beside import open_catalog

    with open_catalog(args) as cat:
        models = cat.models()
    if args.json:
        print_json(models)
    else:
        print_table(COLUMNS, [row(m) for m in models])
    return 0


def row(m: ModelRow) -> list[Any]:
    stats = "-" if m.base is None else ("yes" if m.has_stats else "no")
    secs = m.ingest_seconds
    rel = "" if m.delta_rel_norm is None else f"{m.delta_rel_norm:.3g}"
    return [m.display_name, m.kind, m.base or "", m.status, stats, rel, m.n_tensors,
            human_bytes(m.tensor_bytes), human_bytes(m.block_bytes),
            f"{secs:.2f}" if secs is not None else "", m.version, m.path]
