"""Run one user-supplied read-only SELECT over the catalog in the SQL sandbox (SqlLimits)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import duckdb

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.sql_guard import (
    ALLOWED_TABLE_FUNCTIONS,
    check_duckdb_tree,
    check_readonly,
    check_with_duckdb,
)
from mergepipe.catalog.sql_slots import SqlSlots, slots_for
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.jsonable import jsonable
from mergepipe.core.sql_limits import SqlLimits

__all__ = ["ALLOWED_TABLE_FUNCTIONS", "SqlLimits", "SqlSlots", "check_readonly", "run_readonly",
           "run_readonly_async"]

# How long past its time limit the caller waits for a query's answer before it gets the
# time-limit error anyway (the query then ends, or is interrupted, in its own thread).
DEADLINE_GRACE_S = 0.5
# A query that gets its slot with less time than this left is not started.
MIN_RUN_S = 0.05
# Rows fetched from DuckDB at a time; the row and byte limits are checked after each batch.
FETCH_ROWS = 64
SELECT_TABLES = ("SELECT table_name FROM information_schema.tables "
                 "WHERE table_schema = 'main' AND table_catalog = current_database()")


def _time_limit_error(limits: SqlLimits) -> InvalidRequest:
    return InvalidRequest(f"query failed: query exceeded the {limits.timeout_s:g}s time limit",
                          field="sql")


def run_readonly(cat: Catalog, sql: str, limits: SqlLimits | None = None) -> dict[str, Any]:
    """{columns, rows, truncated} of a checked read-only query, within `limits`.

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
        raise _time_limit_error(lim) from None


async def run_readonly_async(cat: Catalog, sql: str, limits: SqlLimits) -> dict[str, Any]:
    """run_readonly for the event loop: no request thread waits, for a slot or on the query,
    and nothing is parsed before a slot is taken (a flood costs the loop almost nothing)."""
    deadline = time.monotonic() + limits.timeout_s
    slots = slots_for(limits)
    await slots.acquire_async(deadline)
    fut = slots.start(lambda: _run_checked(cat, sql, limits, deadline))
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), max(
            0.0, deadline + DEADLINE_GRACE_S - time.monotonic()))
    except TimeoutError:
        raise _time_limit_error(limits) from None


def _check_time_left(deadline: float, limits: SqlLimits) -> None:
    if deadline - time.monotonic() < MIN_RUN_S:  # a slot came too late to start the query
        raise _time_limit_error(limits)


def sandbox_connection(cat: Catalog, sql: str, limits: SqlLimits) -> duckdb.DuckDBPyConnection:
    """A connection of its own to the catalog's database, after every check of `sql`, with the
    engine limits set (DuckDB's memory_limit, threads and temp size are database-wide)."""
    with cat.reader() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        try:
            tables = {str(r[0]).lower() for r in conn.exec_driver_sql(SELECT_TABLES)}
        finally:
            conn.rollback()
        check_readonly(sql, tables)
        check_with_duckdb(raw, sql)
        check_duckdb_tree(raw, sql, tables)
        own: duckdb.DuckDBPyConnection = raw.duplicate()
    try:
        own.execute("SET enable_progress_bar = false")  # none on the server's stdout
        # numbers from SqlLimits (ints), not user text
        own.execute(f"SET memory_limit = '{int(limits.memory_bytes) >> 20}MiB'")
        own.execute(f"SET threads = {int(limits.threads)}")
        own.execute(f"SET max_temp_directory_size = '{int(limits.temp_bytes) >> 20}MiB'")
    except BaseException:
        own.close()
        raise
    return own


def _run_checked(cat: Catalog, sql: str, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """The work of run_readonly, in its slot's thread."""
    _check_time_left(deadline, limits)
    own = sandbox_connection(cat, sql, limits)
    fired = threading.Event()

    def interrupt() -> None:
        fired.set()
        with contextlib.suppress(duckdb.Error):  # the query ended (its connection closed)
            own.interrupt()

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), interrupt)
    timer.daemon = True
    try:
        own.execute("BEGIN TRANSACTION READ ONLY")
        timer.start()
        cur = own.execute(sql)
        return _fetch(cur, limits, deadline)
    except duckdb.Error as e:  # a user's query failing is the user's error
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise (_time_limit_error(limits) if fired.is_set()
               else InvalidRequest(f"query failed: {msg}", field="sql")) from None
    finally:
        timer.cancel()
        own.close()  # whatever the query did, nothing of it is kept


def _fetch(cur: duckdb.DuckDBPyConnection, limits: SqlLimits, deadline: float
           ) -> dict[str, Any]:
    """Rows in batches of FETCH_ROWS; stop at row_limit, refuse past result_bytes."""
    columns = [d[0] for d in cur.description or []]
    rows: list[Any] = []
    size = 2
    while len(rows) <= limits.row_limit:
        batch = cur.fetchmany(min(FETCH_ROWS, limits.row_limit + 1 - len(rows)))
        if not batch:
            break
        out = [jsonable(list(r)) for r in batch]
        size += sum(len(json.dumps(r, default=str)) + 1 for r in out)
        if size > limits.result_bytes:
            raise InvalidRequest(f"the result is over the {limits.result_bytes} byte limit "
                                 "(as JSON); select fewer rows or columns", field="sql")
        if time.monotonic() > deadline:
            raise _time_limit_error(limits)
        rows.extend(out)
    truncated = len(rows) > limits.row_limit
    return {"columns": columns, "rows": rows[:limits.row_limit], "truncated": truncated}
