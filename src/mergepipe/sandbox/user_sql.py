"""User SQL over the catalog on either backend (DuckDB sandbox, or PostgreSQL's reader role)."""

from __future__ import annotations

import time
from typing import Any

from mergepipe.catalog.db import Catalog, outage
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.readonly_pg import run_readonly_postgres
from mergepipe.sandbox.readonly_sql import DEADLINE_GRACE_S, run_readonly
from mergepipe.sandbox.sql_exec import check_time_left, time_limit_error
from mergepipe.sandbox.sql_procs import POOL
from mergepipe.sandbox.sql_slots import slots_for


def _postgres(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    try:
        return run_readonly_postgres(cat, sql, row_limit=limits.row_limit,
                                     timeout_s=limits.timeout_s, byte_limit=limits.result_bytes)
    except Exception as e:
        down = outage(e)  # the reader role's session is not the catalog's own: translate here
        if down is None:
            raise
        raise down from e


def run_user_sql(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """{columns, rows, truncated} of one read-only SELECT, with the same limits on both, in
    this process (the CLI: a user's query there can only hurt the user's own process)."""
    if cat.postgres:
        return _postgres(cat, sql, limits)
    return run_readonly(cat, sql, limits)


def _isolated(cat: Catalog, sql: str, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """A DuckDB query in a worker process, over a snapshot of the catalog's tables."""
    # the server's: the snapshot's Arrow copy needs the whole duckdb package, which the
    # CLI's `sql` does not load (0.05 s)
    from mergepipe.sandbox.sql_snapshot import snapshot_for

    check_time_left(deadline, limits)
    path, version = snapshot_for(cat).current()
    return POOL.run(str(path), version, sql, limits, deadline)


async def run_user_sql_async(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """run_user_sql for the server: the query runs on one of the sandbox's slots, never in a
    request thread: on DuckDB in a worker process (memory-capped, killed past its time limit;
    sql_procs.py), on PostgreSQL in a slot thread (its statement_timeout ends it there)."""
    import asyncio  # the server's; the CLI's `sql` does not load it (0.05 s)

    deadline = time.monotonic() + limits.timeout_s
    slots = slots_for(limits)
    await slots.acquire_async(deadline)
    if cat.postgres:
        return await asyncio.wrap_future(slots.start(lambda: _postgres(cat, sql, limits)))
    fut = slots.start(lambda: _isolated(cat, sql, limits, deadline))
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), max(
            0.0, deadline + DEADLINE_GRACE_S - time.monotonic()))
    except TimeoutError:
        raise time_limit_error(limits) from None
