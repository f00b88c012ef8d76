"""`mergepipe sql "SELECT ..."`: read-only SQL over the catalog."""

from __future__ import annotations

import argparse

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.user_sql import run_user_sql
from mergepipe.cli.main import print_json
from mergepipe.cli.table import print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sql", help="read-only SQL over the catalog")
    p.add_argument("query", help="one SELECT (or WITH ... SELECT) statement")
    p.add_argument("--json", action="store_true", help='print {"columns": [...], "rows": [...]}')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with Catalog(args.settings.catalog) as cat:
        result = run_user_sql(cat, args.query, row_limit=args.settings.sql_row_limit,
                              timeout_s=args.settings.sql_timeout_s)
    if args.json:
        print_json(result)
    else:
        print_table(result["columns"], result["rows"])
    return 0
