"""Run one user-supplied read-only SELECT over the catalog, with row, size and time limits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection
from typing import Any

import duckdb
import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import ParseError

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Busy, InvalidRequest
from mergepipe.core.jsonable import jsonable

# Functions that read files or the network, touch settings or state, or reveal the server's
# files; refused even though the database itself also runs with enable_external_access=false.
FORBIDDEN_FUNCTIONS = {
    "read_csv", "read_csv_auto", "read_parquet", "parquet_scan", "read_json", "read_json_auto",
    "read_json_objects", "read_ndjson", "read_text", "read_blob", "glob", "sniff_csv",
    "parquet_metadata", "parquet_schema", "iceberg_scan", "delta_scan", "sqlite_scan",
    "postgres_scan", "mysql_scan", "read_xlsx", "getenv", "current_setting", "set_config",
    "http_get", "query", "query_table", "checkpoint", "force_checkpoint", "setseed",
    "nextval", "currval", "setval", "getvariable",
}
FORBIDDEN_PREFIXES = ("read_", "pragma_", "duckdb_", "sqlite_", "postgres_", "mysql_",
                      "iceberg_", "delta_", "parquet_", "http", "write_", "copy_", "load_",
                      "install_", "enable_", "disable_", "set_", "which_secret")
# Table functions a query may use in FROM besides the catalog's own tables and views.
ALLOWED_TABLE_FUNCTIONS = {"range", "generate_series", "unnest"}
FORBIDDEN_NODES = (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter,
                   exp.Command, exp.Set, exp.Pragma, exp.Copy, exp.Attach, exp.Detach,
                   exp.Merge, exp.Use, exp.Transaction, exp.Commit, exp.Rollback, exp.Into,
                   exp.LoadData, exp.Export)
# User queries running at once, counting those DuckDB has not stopped yet after their time
# limit (one huge scalar, e.g. repeat('x', 2e9) or a 1e8-element list, ignores interrupts until
# it is computed): a flood of such queries holds these slots, not the whole server.
MAX_RUNNING = 2
# How long past its time limit the caller waits for a query's answer before it gets the
# time-limit error anyway (the query then ends, or is interrupted, in its own thread).
DEADLINE_GRACE_S = 1.0
_slots = threading.BoundedSemaphore(MAX_RUNNING)
SELECT_TABLES = ("SELECT table_name FROM information_schema.tables "
                 "WHERE table_schema = 'main' AND table_catalog = current_database()")


def _function_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def _forbidden_function(name: str) -> bool:
    return name in FORBIDDEN_FUNCTIONS or name.startswith(FORBIDDEN_PREFIXES)


def _check_table(node: exp.Table, tables: Collection[str], ctes: set[str]) -> None:
    """A FROM item must be a catalog table or view, a CTE, information_schema, or range()."""
    if isinstance(node.this, exp.Literal):
        raise InvalidRequest(f"reading files ({node.this.sql()}) is not allowed", field="sql")
    if isinstance(node.this, exp.Func):
        name = _function_name(node.this)
        if name not in ALLOWED_TABLE_FUNCTIONS:
            raise InvalidRequest(f"table function {name}() is not allowed; query the catalog's "
                                 "tables", field="sql")
        return
    name, schema = node.name.lower(), node.db.lower()
    if node.catalog:
        raise InvalidRequest(f"table {node.sql()} names another database", field="sql")
    if schema == "information_schema":
        return
    if schema not in ("", "main"):
        raise InvalidRequest(f"schema {node.db!r} is not part of the catalog", field="sql")
    if (not schema and name in ctes) or name in tables:
        return
    raise InvalidRequest(f"table {node.name!r} is not a catalog table (try: SELECT table_name "
                         "FROM information_schema.tables)", field="sql")


TOO_DEEP = "sql is nested too deeply (parentheses, brackets or subqueries)"
# Parsing is not under the time limit (and runs twice): a megabyte of SQL would cost seconds of
# CPU per request. Catalog queries are short.
MAX_SQL_CHARS = 64 * 1024


def check_readonly(sql: str, tables: Collection[str] | None = None) -> None:
    """Raise InvalidRequest unless `sql` is exactly one SELECT / WITH ... SELECT statement.

    With `tables` (lower-case names of the catalog's tables and views), FROM items are also
    restricted to those, the query's CTEs, information_schema and range/generate_series/unnest."""
    if isinstance(sql, str) and len(sql) > MAX_SQL_CHARS:
        raise InvalidRequest(f"sql is {len(sql)} characters long, over the {MAX_SQL_CHARS} "
                             "limit", field="sql")
    try:
        _check_readonly(sql, tables)
    except RecursionError:  # sqlglot recurses once per nesting level
        raise InvalidRequest(TOO_DEEP, field="sql") from None


def _check_readonly(sql: str, tables: Collection[str] | None) -> None:
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidRequest("sql is empty", field="sql")
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except (ParseError, sqlglot.errors.TokenError) as e:
        raise InvalidRequest(f"sql does not parse: {str(e).splitlines()[0]}", field="sql") from None
    if len(statements) != 1:
        raise InvalidRequest(f"exactly one statement is allowed, got {len(statements)}",
                             field="sql")
    (tree,) = statements
    if not isinstance(tree, exp.Query):
        raise InvalidRequest(f"only SELECT queries are allowed, not {tree.key.upper()}",
                             field="sql")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for node in tree.walk():
        if isinstance(node, FORBIDDEN_NODES):
            raise InvalidRequest(f"{node.key.upper()} is not allowed in a read-only query",
                                 field="sql")
        if isinstance(node, exp.Func):
            name = _function_name(node)
            if _forbidden_function(name):
                raise InvalidRequest(f"function {name}() is not allowed (no file or network "
                                     "access, no settings or state)", field="sql")
        if isinstance(node, exp.Table):
            if tables is not None:
                _check_table(node, tables, ctes)
            elif isinstance(node.this, exp.Literal):
                raise InvalidRequest(f"reading files ({node.this.sql()}) is not allowed",
                                     field="sql")


def _check_with_duckdb(raw: duckdb.DuckDBPyConnection, sql: str) -> None:
    """DuckDB's own parser must agree: one statement, of type SELECT."""
    try:
        statements = raw.extract_statements(sql)
    except duckdb.Error as e:
        raise InvalidRequest(f"sql does not parse: {str(e).splitlines()[0]}", field="sql") from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise InvalidRequest("only one SELECT query is allowed", field="sql")


def check_duckdb_tree(raw: duckdb.DuckDBPyConnection, sql: str,
                      tables: Collection[str]) -> None:
    """The checks of check_readonly again, over DuckDB's own parse tree (json_serialize_sql):
    a query that sqlglot and DuckDB read differently cannot slip a function or a table past."""
    try:
        row = raw.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()
        doc = json.loads(row[0]) if row else None
    except RecursionError:
        raise InvalidRequest(TOO_DEEP, field="sql") from None
    except (duckdb.Error, ValueError, TypeError) as e:
        raise InvalidRequest(f"sql does not parse: {str(e).splitlines()[0]}", field="sql") from None
    if not isinstance(doc, dict) or doc.get("error"):
        msg = doc.get("error_message") if isinstance(doc, dict) else None
        raise InvalidRequest(f"sql is not one plain SELECT ({msg or 'unreadable'})", field="sql")
    nodes: list[dict[str, Any]] = []
    stack: list[Any] = [doc]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            nodes.append(n)
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    ctes = {str(e.get("key", "")).lower() for n in nodes
            if isinstance(n.get("cte_map"), dict)
            for e in n["cte_map"].get("map") or [] if isinstance(e, dict)}
    for n in nodes:
        kind = n.get("type")
        if n.get("class") in ("FUNCTION", "WINDOW", "AGGREGATE") and "function_name" in n:
            name = str(n["function_name"]).lower()
            if _forbidden_function(name):
                raise InvalidRequest(f"function {name}() is not allowed (no file or network "
                                     "access, no settings or state)", field="sql")
        if kind == "TABLE_FUNCTION":
            fn = n.get("function")
            name = str(fn.get("function_name", "?") if isinstance(fn, dict) else "?").lower()
            if name not in ALLOWED_TABLE_FUNCTIONS:
                raise InvalidRequest(f"table function {name}() is not allowed; query the "
                                     "catalog's tables", field="sql")
        if kind in ("BASE_TABLE", "SHOW_REF") and n.get("table_name"):
            name = str(n["table_name"]).lower()
            schema = str(n.get("schema_name") or "").lower()
            if n.get("catalog_name"):
                raise InvalidRequest(f"table {n['table_name']!r} names another database",
                                     field="sql")
            if schema == "information_schema" or (not schema and name in ctes) or (
                    schema in ("", "main") and name in tables):
                continue
            raise InvalidRequest(f"table {n['table_name']!r} is not a catalog table (try: "
                                 "SELECT table_name FROM information_schema.tables)", field="sql")


def run_readonly(cat: Catalog, sql: str, *, row_limit: int = 10_000,
                 timeout_s: float = 10.0, byte_limit: int = 16 << 20) -> dict[str, Any]:
    """{columns, rows, truncated} of a checked read-only query; interrupted after `timeout_s`;
    refused when the result is more than `byte_limit` bytes of JSON.

    The caller has its answer within about `timeout_s` (+ DEADLINE_GRACE_S) whatever the query
    does; at most MAX_RUNNING queries run at once (Busy after waiting `timeout_s` for a slot)."""
    check_readonly(sql)
    t0 = time.monotonic()
    slots = _slots
    if not slots.acquire(timeout=timeout_s):
        raise Busy(f"{MAX_RUNNING} SQL queries are already running; retry later", field="sql")
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = _run_checked(cat, sql, row_limit, timeout_s, byte_limit)
        except BaseException as e:  # noqa: BLE001 - handed over to the caller's thread
            box["err"] = e
        finally:
            slots.release()

    worker = threading.Thread(target=work, name="mergepipe-sql", daemon=True)
    worker.start()
    worker.join(max(0.0, t0 + timeout_s + DEADLINE_GRACE_S - time.monotonic()))
    if worker.is_alive():
        raise InvalidRequest(f"query failed: query exceeded the {timeout_s:g}s time limit",
                             field="sql")
    if "err" in box:
        raise box["err"]
    out: dict[str, Any] = box["out"]
    return out


def _run_checked(cat: Catalog, sql: str, row_limit: int, timeout_s: float,
                 byte_limit: int) -> dict[str, Any]:
    """The work of run_readonly, in its own thread."""
    with cat.reader() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        try:
            conn.exec_driver_sql("SET enable_progress_bar = false")  # none on the server's stdout
            tables = {str(r[0]).lower() for r in conn.exec_driver_sql(SELECT_TABLES)}
        finally:
            conn.rollback()
        check_readonly(sql, tables)
        _check_with_duckdb(raw, sql)
        check_duckdb_tree(raw, sql, tables)
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
    out = [jsonable(list(r)) for r in rows[:row_limit]]
    size = len(json.dumps(out, default=str))
    if size > byte_limit:
        raise InvalidRequest(f"the result is {size} bytes of JSON, over the {byte_limit} byte "
                             "limit; select fewer rows or columns", field="sql")
    return {"columns": columns, "rows": out, "truncated": truncated}
