"""Run one user-supplied read-only SELECT over the catalog in the SQL sandbox (SqlLimits)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import (
    FETCH_ROWS,
    MIN_RUN_S,
    SELECT_TABLES,
    check_all,
    check_time_left,
    run_on,
    set_engine_limits,
    time_limit_error,
)
from mergepipe.sandbox.sql_guard import ALLOWED_TABLE_FUNCTIONS, check_readonly
from mergepipe.sandbox.sql_slots import SqlSlots, slots_for

__all__ = ["ALLOWED_TABLE_FUNCTIONS", "FETCH_ROWS", "MIN_RUN_S", "SELECT_TABLES", "SqlLimits",
           "SqlSlots", "check_readonly", "run_readonly"]

# How long past its time limit the caller waits for a query's answer before it gets the
# time-limit error anyway (the query then ends, or is interrupted, in its own thread).
DEADLINE_GRACE_S = 0.5


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
