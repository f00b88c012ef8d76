"""User SQL over the catalog: on DuckDB checked (sql_guard.py), then run under SqlLimits on a
read-only snapshot of the catalog (in this process for the CLI and the Python API, in a worker
process for the server); on PostgreSQL in a read-only reader role (readonly_pg.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import (
    catalog_tables,
    check_time_left,
    run_on,
    time_limit_error,
)
from mergepipe.sandbox.sql_guard import check_query
from mergepipe.sandbox.sql_procs import POOL
from mergepipe.sandbox.sql_slots import slots_for
from mergepipe.sandbox.sql_snapshot import snapshot_for

# How long past its time limit the caller waits for a query's answer before it gets the
# time-limit error anyway (the query then ends, or is interrupted, in its own thread).
DEADLINE_GRACE_S = 0.5


def run_user_sql(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """{columns, rows, truncated} of one read-only SELECT in this process (the CLI: a user's
    query there can only hurt the user's own process)."""
    if cat.postgres:
        return _postgres()(cat, sql, limits)
    return run_readonly(cat, sql, limits)


async def run_user_sql_async(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """run_user_sql for the server, on one of the sandbox's slots, never in a request thread:
    on DuckDB in a worker process (memory-capped, killed past its time limit), on PostgreSQL
    in a slot thread (its statement_timeout ends it there)."""
    import asyncio  # the server's; the CLI's `sql` does not load it (0.05 s)

    deadline = time.monotonic() + limits.timeout_s
    slots = slots_for(limits)
    await slots.acquire_async(deadline)
    if cat.postgres:
        return await asyncio.wrap_future(
            slots.start(lambda: _postgres()(cat, sql, limits)))
    fut = slots.start(lambda: _isolated(cat, sql, limits, deadline))
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), max(
            0.0, deadline + DEADLINE_GRACE_S - time.monotonic()))
    except TimeoutError:
        raise time_limit_error(limits) from None


def _postgres() -> Callable[[Catalog, str, SqlLimits], dict[str, Any]]:
    """readonly_pg's runner, imported on first use: its parser (sqlglot, 0.3 s to import) is
    for PostgreSQL catalogs only."""
    from mergepipe.sandbox.readonly_pg import run_readonly_postgres

    return run_readonly_postgres


def run_readonly(cat: Catalog, sql: str, limits: SqlLimits | None = None) -> dict[str, Any]:
    """{columns, rows, truncated} of a checked query on DuckDB in this process: an answer
    within the time limit (waiting for a slot included) + DEADLINE_GRACE_S whatever the query
    does; Busy (429) when no slot frees."""
    lim = limits or SqlLimits()
    deadline = time.monotonic() + lim.timeout_s
    slots = slots_for(lim)
    slots.acquire(deadline)
    fut = slots.start(lambda: _run_checked(cat, sql, lim, deadline))
    try:
        return fut.result(timeout=max(0.0, deadline + DEADLINE_GRACE_S - time.monotonic()))
    except FutureTimeout:
        raise time_limit_error(lim) from None


def _run_checked(cat: Catalog, sql: str, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """In the slot's thread, on the sandbox's own database: this process's snapshot of the
    catalog, opened read-only with sandbox_config (its limits there only, the catalog's
    settings untouched)."""
    check_time_left(deadline, limits)
    with snapshot_for(cat).connect(limits) as own:
        check_query(own, sql, catalog_tables(own))
        return run_on(own, sql, limits, deadline)


def _isolated(cat: Catalog, sql: str, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """A DuckDB query in a worker process, over a snapshot of the catalog's tables."""
    check_time_left(deadline, limits)
    path, version = snapshot_for(cat).current()
    return POOL.run(str(path), version, sql, limits, deadline)
