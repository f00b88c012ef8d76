"""A SQL worker process: user queries over a catalog snapshot, one JSON request and reply per
line, under a data-size limit (RLIMIT_DATA); its parent kills it past the time limit."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from typing import IO, Any

from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import catalog_tables, run_on, sandbox_config
from mergepipe.sandbox.sql_guard import check_query

NICE = 10  # scheduling priority of the queries
DATA_LIMIT = 0  # RLIMIT_DATA of this process (from argv)


class Database:
    """The snapshot this worker has open, with sandbox_config (reopened when the parent names a
    newer snapshot or other limits)."""

    def __init__(self) -> None:
        self.key: tuple[str, int, SqlLimits] | None = None
        self.conn: duckdb.DuckDBPyConnection | None = None
        self.tables: set[str] = set()

    def open(self, path: str, version: int, limits: SqlLimits) -> duckdb.DuckDBPyConnection:
        if self.conn is None or self.key != (path, version, limits):
            if self.conn is not None:
                self.conn.close()
            self.conn = duckdb.connect(path, read_only=True, config=sandbox_config(limits))
            self.tables = catalog_tables(self.conn)
            self.key = (path, version, limits)
        return self.conn


def answer(db: Database, req: dict[str, Any]) -> dict[str, Any]:
    """The reply to one request."""
    deadline = time.monotonic() + float(req["time_s"])
    limits = SqlLimits(**req["limits"])
    try:
        conn = db.open(str(req["db"]), int(req["version"]), limits)
        check_query(conn, req["sql"], db.tables)
        return {"ok": run_on(conn, req["sql"], limits, deadline)}
    except InvalidRequest as e:
        msg = e.message
        if "out of memory" in msg.lower():
            msg = f"{msg.rstrip('.')}. {limits_text(limits)}"
        return {"error": {"message": msg, "field": e.field}}
    except MemoryError:
        return {"error": {"message": f"query failed: out of memory. {limits_text(limits)}",
                          "field": "sql", "fatal": True}}
    except (duckdb.Error, RecursionError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return {"error": {"message": f"query failed: {first}", "field": "sql"}}


def limits_text(limits: SqlLimits) -> str:
    data = f", {DATA_LIMIT >> 20} MiB of data per SQL process" if DATA_LIMIT else ""
    return f"SQL limits: {limits.memory_bytes >> 20} MiB for the engine{data}"


def serve(rd: IO[bytes], out: IO[bytes]) -> None:
    db = Database()
    for line in rd:
        reply = answer(db, json.loads(line))
        try:
            data = json.dumps(reply).encode() + b"\n"
        except MemoryError:
            reply = {"error": {"fatal": True}}
            data = (b'{"error": {"message": "query failed: out of memory while encoding the '
                    b'result", "field": "sql", "fatal": true}}\n')
        out.write(data)
        out.flush()
        if reply.get("error", {}).get("fatal"):
            return  # a worker that ran out of memory is replaced


def main() -> None:
    out = os.fdopen(os.dup(1), "wb")  # the replies' pipe: nothing else may write to it
    os.dup2(2, 1)
    # After the imports (a CPU-second, which a niced process on a busy host waits long for):
    # under CPU contention the server's requests come before the queries.
    with contextlib.suppress(OSError):
        os.nice(NICE)
    global DATA_LIMIT
    DATA_LIMIT = int(sys.argv[1])
    if DATA_LIMIT > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
