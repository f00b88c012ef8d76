"""User SQL over the catalog on either backend: DuckDB's sandbox (checked, then run under
SqlLimits on a connection of its own: in this process for the CLI, in a worker process over a
snapshot for the server), or PostgreSQL's read-only reader role."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

from mergepipe.catalog.db import Catalog, outage
from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.readonly_pg import run_readonly_postgres
from mergepipe.sandbox.sql_exec import (
    SELECT_TABLES,
    check_all,
    check_time_left,
    run_on,
    set_engine_limits,
    time_limit_error,
)
from mergepipe.sandbox.sql_procs import POOL
from mergepipe.sandbox.sql_slots import slots_for

# How long past its time limit the caller waits for a query's answer before it gets the
# time-limit error anyway (the query then ends, or is interrupted, in its own thread).
DEADLINE_GRACE_S = 0.5


def run_user_sql(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """{columns, rows, truncated} of one read-only SELECT, with the same limits on both, in
    this process (the CLI: a user's query there can only hurt the user's own process)."""
    if cat.postgres:
        return _postgres(cat, sql, limits)
    return run_readonly(cat, sql, limits)


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


def run_readonly(cat: Catalog, sql: str, limits: SqlLimits | None = None) -> dict[str, Any]:
    """{columns, rows, truncated} of a checked read-only query on DuckDB, in this process,
    within `limits`.

    The caller has its answer within the time limit (counted from the call, waiting for a slot
    included) + DEADLINE_GRACE_S whatever the query does; Busy (429) when no slot frees."""
    lim = limits or SqlLimits()
    deadline = time.monotonic() + lim.timeout_s
    slots = slots_for(lim)
    slots.acquire(deadline)
    fut = slots.start(lambda: _run_checked(cat, sql, lim, deadline))
    try:
        return fut.result(timeout=max(0.0, deadline + DEADLINE_GRACE_S - time.monotonic()))
    except FutureTimeout:
        raise time_limit_error(lim) from None


@contextmanager
def sandbox_connection(cat: Catalog, sql: str, limits: SqlLimits
                       ) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection of its own to the catalog's database, after every check of `sql`, with the
    engine limits set (DuckDB's memory_limit, threads and temp size are database-wide); closed
    when the block ends, whatever the query did (nothing of it is kept)."""
    with cat.duckdb_reader() as raw:
        tables = {str(r[0]).lower() for r in raw.execute(SELECT_TABLES).fetchall()}
        check_all(raw, sql, tables)
    with cat.duckdb_connection() as own:
        set_engine_limits(own, limits)
        yield own


def _run_checked(cat: Catalog, sql: str, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """The work of run_readonly, in its slot's thread: the catalog's close() waits for it."""
    check_time_left(deadline, limits)
    with sandbox_connection(cat, sql, limits) as own:
        return run_on(own, sql, limits, deadline)


def _isolated(cat: Catalog, sql: str, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """A DuckDB query in a worker process, over a snapshot of the catalog's tables."""
    # the server's: the snapshot's Arrow copy needs the whole duckdb package, which the
    # CLI's `sql` does not load (0.05 s)
    from mergepipe.sandbox.sql_snapshot import snapshot_for

    check_time_left(deadline, limits)
    path, version = snapshot_for(cat).current()
    return POOL.run(str(path), version, sql, limits, deadline)


def _postgres(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    try:
        return run_readonly_postgres(cat, sql, row_limit=limits.row_limit,
                                     timeout_s=limits.timeout_s, byte_limit=limits.result_bytes)
    except Exception as e:
        down = outage(e)  # the reader role's session is not the catalog's own: translate here
        if down is None:
            raise
        raise down from e
