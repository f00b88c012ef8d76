"""One checked user query on the sandbox's DuckDB connection: its settings, interrupt at the
deadline, rows fetched in batches under the row and byte limits (in-process and in the SQL
workers)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.jsonable import jsonable
from mergepipe.core.sql_limits import SqlLimits

if TYPE_CHECKING:
    from mergepipe.catalog.duckdb_database import Config

# A query that gets its slot with less time than this left is not started.
MIN_RUN_S = 0.05
# How often a query past its deadline is interrupted again until it ends.
INTERRUPT_EVERY_S = 0.1
# Rows fetched from DuckDB at a time; the row and byte limits are checked after each batch.
FETCH_ROWS = 64
SELECT_TABLES = ("SELECT table_name FROM information_schema.tables "
                 "WHERE table_schema = 'main' AND table_catalog = current_database()")


def time_limit_error(limits: SqlLimits) -> InvalidRequest:
    return InvalidRequest(f"query failed: query exceeded the {limits.timeout_s:g}s time limit",
                          field="sql")


def check_time_left(deadline: float, limits: SqlLimits) -> None:
    if deadline - time.monotonic() < MIN_RUN_S:  # a slot came too late to start the query
        raise time_limit_error(limits)


def sandbox_config(limits: SqlLimits) -> Config:
    """DuckDB's settings for the sandbox's own database (a read-only snapshot of the catalog):
    the limits of `limits`, no file or network access, no extension loading, no Python objects
    as tables, and the configuration locked (no query can change it)."""
    return {"threads": int(limits.threads),
            "memory_limit": f"{int(limits.memory_bytes) >> 20}MiB",
            "max_temp_directory_size": f"{int(limits.temp_bytes) >> 20}MiB",
            "enable_external_access": False, "autoload_known_extensions": False,
            "autoinstall_known_extensions": False, "python_enable_replacements": False,
            "lock_configuration": True}


def catalog_tables(conn: duckdb.DuckDBPyConnection) -> set[str]:
    return {str(r[0]).lower() for r in conn.execute(SELECT_TABLES).fetchall()}


def run_on(own: duckdb.DuckDBPyConnection, sql: str, limits: SqlLimits, deadline: float
           ) -> dict[str, Any]:
    """{columns, rows, truncated} of an already checked `sql` on `own` (sandbox_config),
    interrupted at `deadline` (time.monotonic)."""
    fired = threading.Event()
    done = threading.Event()
    guard = threading.Lock()  # `own` is never interrupted once the query has ended

    def interrupt() -> None:
        """At the deadline, interrupt `own`, and again every INTERRUPT_EVERY_S until the query
        ends: DuckDB forgets an interrupt that comes before the statement starts."""
        if done.wait(max(0.0, deadline - time.monotonic())):
            return
        fired.set()
        while True:
            with guard:
                if done.is_set():
                    return
                with contextlib.suppress(duckdb.Error):
                    own.interrupt()
            if done.wait(INTERRUPT_EVERY_S):
                return

    timer = threading.Thread(target=interrupt, name="mergepipe-sql-deadline", daemon=True)
    try:
        own.execute("BEGIN TRANSACTION READ ONLY")
        timer.start()
        cur = own.execute(sql)
        return fetch(cur, limits, deadline)
    except duckdb.Error as e:  # a user's query failing is the user's error
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise (time_limit_error(limits) if fired.is_set()
               else InvalidRequest(f"query failed: {msg}", field="sql")) from None
    finally:
        with guard:
            done.set()
        with contextlib.suppress(duckdb.Error):
            own.execute("ROLLBACK")


def fetch(cur: Any, limits: SqlLimits, deadline: float) -> dict[str, Any]:
    """Rows of a DB-API cursor in batches of FETCH_ROWS; stop at row_limit, refuse past
    result_bytes."""
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
            raise time_limit_error(limits)
        rows.extend(out)
    truncated = len(rows) > limits.row_limit
    return {"columns": columns, "rows": rows[:limits.row_limit], "truncated": truncated}
