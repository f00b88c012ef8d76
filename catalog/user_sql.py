"""User SQL over the catalog on either backend (DuckDB sandbox, or PostgreSQL's reader role)."""

from __future__ import annotations

from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.readonly_pg import run_readonly_postgres
from mergepipe.catalog.readonly_sql import run_readonly


def run_user_sql(cat: Catalog, sql: str, *, row_limit: int = 10_000, timeout_s: float = 10.0,
                 byte_limit: int = 16 << 20) -> dict[str, Any]:
    """{columns, rows, truncated} of one read-only SELECT, with the same limits on both."""
    run = run_readonly_postgres if cat.postgres else run_readonly
    return run(cat, sql, row_limit=row_limit, timeout_s=timeout_s, byte_limit=byte_limit)
