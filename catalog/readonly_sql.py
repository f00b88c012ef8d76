"""Run one user-supplied read-only SELECT over the catalog, with row and time limits."""

from __future__ import annotations

import threading
from typing import Any

import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import ParseError

from catalog.db import Catalog
from mergepipe.errors import InvalidRequest

# Functions that read files or the network, or touch settings; refused even though the
# database itself also runs with enable_external_access=false.
FORBIDDEN_FUNCTIONS = {
    "read_csv", "read_csv_auto", "read_parquet", "parquet_scan", "read_json", "read_json_auto",
    "read_json_objects", "read_ndjson", "read_text", "read_blob", "glob", "sniff_csv",
    "parquet_metadata", "parquet_schema", "iceberg_scan", "delta_scan", "sqlite_scan",
    "postgres_scan", "mysql_scan", "read_xlsx", "getenv", "current_setting", "set_config",
    "http_get", "query", "query_table",
}
FORBIDDEN_NODES = (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter,
                   exp.Command, exp.Set, exp.Pragma, exp.Copy, exp.Attach, exp.Detach,
                   exp.Merge, exp.Use, exp.Transaction, exp.Commit, exp.Rollback, exp.Into,
                   exp.LoadData, exp.Export)


def check_readonly(sql: str) -> None:
    """Raise InvalidRequest unless `sql` is exactly one SELECT / WITH ... SELECT statement."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidRequest("sql is empty", field="sql")
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except ParseError as e:
        raise InvalidRequest(f"sql does not parse: {str(e).splitlines()[0]}", field="sql") from None
    if len(statements) != 1:
        raise InvalidRequest(f"exactly one statement is allowed, got {len(statements)}",
                             field="sql")
    (tree,) = statements
    if not isinstance(tree, exp.Query):
        raise InvalidRequest(f"only SELECT queries are allowed, not {tree.key.upper()}",
                             field="sql")
    for node in tree.walk():
        if isinstance(node, FORBIDDEN_NODES):
            raise InvalidRequest(f"{node.key.upper()} is not allowed in a read-only query",
                                 field="sql")
        if isinstance(node, exp.Func):
            name = (node.sql_name() if not isinstance(node, exp.Anonymous) else node.name).lower()
            if name in FORBIDDEN_FUNCTIONS:
                raise InvalidRequest(f"function {name}() is not allowed (no file or network "
                                     "access)", field="sql")
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Literal):
            raise InvalidRequest(f"reading files ({node.this.sql()}) is not allowed", field="sql")


def run_readonly(cat: Catalog, sql: str, *, row_limit: int = 10_000,
                 timeout_s: float = 10.0) -> dict[str, Any]:
    """{columns, rows, truncated} of a checked read-only query; interrupted after `timeout_s`."""
    check_readonly(sql)
    with cat.reader() as conn:
        raw = conn.connection.driver_connection
        timer = threading.Timer(timeout_s, raw.interrupt)
        timer.start()
        try:
            try:
                cur = conn.exec_driver_sql(sql)
                columns = list(cur.keys())
                rows = cur.fetchmany(row_limit + 1)
            finally:
                conn.rollback()  # whatever the query did, nothing of it is kept
        except Exception as e:  # noqa: BLE001 - a user's query failing is the user's error
            if isinstance(e, InvalidRequest):
                raise
            msg = str(getattr(e, "orig", e)).strip().splitlines()[0]
            if not timer.is_alive():
                msg = f"query exceeded the {timeout_s:g}s time limit"
            raise InvalidRequest(f"query failed: {msg}", field="sql") from None
        finally:
            timer.cancel()
    truncated = len(rows) > row_limit
    return {"columns": columns, "rows": [list(_jsonable(v) for v in r) for r in rows[:row_limit]],
            "truncated": truncated}


def _jsonable(v: Any) -> Any:
    if isinstance(v, int | float | str | bool) or v is None:
        return v
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)
