"""User SQL over the catalog on either backend (DuckDB sandbox, or PostgreSQL's reader role)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.readonly_pg import run_readonly_postgres
from mergepipe.catalog.readonly_sql import run_readonly, run_readonly_async
from mergepipe.catalog.sql_slots import slots_for
from mergepipe.core.sql_limits import SqlLimits


def _postgres(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    return run_readonly_postgres(cat, sql, row_limit=limits.row_limit,
                                 timeout_s=limits.timeout_s, byte_limit=limits.result_bytes)


def run_user_sql(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """{columns, rows, truncated} of one read-only SELECT, with the same limits on both."""
    if cat.postgres:
        return _postgres(cat, sql, limits)
    return run_readonly(cat, sql, limits)


async def run_user_sql_async(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """run_user_sql for the event loop: the query runs in one of the sandbox's slot threads
    (PostgreSQL's own statement_timeout ends it there), never in a request thread."""
    if not cat.postgres:
        return await run_readonly_async(cat, sql, limits)
    deadline = time.monotonic() + limits.timeout_s
    slots = slots_for(limits)
    await slots.acquire_async(deadline)
    return await asyncio.wrap_future(slots.start(lambda: _postgres(cat, sql, limits)))
