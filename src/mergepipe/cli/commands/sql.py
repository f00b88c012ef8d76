"""`mergepipe sql "SELECT ..."`: read-only SQL over the catalog."""

from __future__ import annotations

import argparse
import os

from mergepipe.cli.main import print_json
from mergepipe.cli.table import print_table
from mergepipe.core.errors import NotFound


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sql", help="read-only SQL over the catalog")
    p.add_argument("query", help="one SELECT (or WITH ... SELECT) statement")
    p.add_argument("--json", action="store_true", help='print {"columns": [...], "rows": [...]}')
    p.set_defaults(func=run, beside_server=True)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.beside import open_catalog

    path = str(args.settings.catalog)
    if "://" not in path and not os.path.isfile(path):  # a query never creates a catalog
        raise NotFound(f"catalog {path!r} does not exist (--catalog / $MERGEPIPE_CATALOG)",
                       field="catalog")
    with open_catalog(args) as cat:
        result = cat.sql(args.query)
    if args.json:
        print_json(result)
    else:
        print_table(result.columns, result.rows)
    return 0
