"""The user-SQL guard: one SELECT over the catalog's tables, CTE names resolved by scope."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, cast

import sqlglot
import sqlglot.expressions as exp
from sqlglot.errors import ParseError

from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import InvalidRequest

# Functions that read files or the network, touch settings or state, or reveal the server's
# files, settings or metadata; refused even though the database also runs with
# enable_external_access=false. Names as DuckDB spells them and as sqlglot does (sql_name).
FORBIDDEN_FUNCTIONS = {
    "read_csv", "read_csv_auto", "read_parquet", "parquet_scan", "read_json", "read_json_auto",
    "read_json_objects", "read_ndjson", "read_text", "read_blob", "glob", "sniff_csv",
    "parquet_metadata", "parquet_schema", "iceberg_scan", "delta_scan", "sqlite_scan",
    "postgres_scan", "mysql_scan", "read_xlsx", "getenv", "current_setting", "set_config",
    "http_get", "query", "query_table", "checkpoint", "force_checkpoint", "setseed",
    "nextval", "currval", "setval", "getvariable",
    # metadata about the server: database and schema names, version, users, the log
    "current_database", "current_catalog", "current_schema", "current_schemas", "current_role",
    "current_user", "current_query", "current_query_id", "current_connection_id",
    "current_transaction_id", "current_version", "session_user", "user", "version",
    "col_description", "obj_description", "shobj_description", "format_pg_type",
    "map_to_pg_oid", "map_type_id_to_pg_oid", "in_search_path", "txid_current", "write_log",
    "parse_duckdb_log_message", "stats", "platform", "user_agent",
}
FORBIDDEN_PREFIXES = ("read_", "pragma_", "duckdb_", "sqlite_", "postgres_", "mysql_",
                      "iceberg_", "delta_", "parquet_", "http", "write_", "copy_", "load_",
                      "install_", "enable_", "disable_", "set_", "which_secret", "pg_", "has_")
# Table functions a query may use in FROM besides the catalog's own tables and views.
ALLOWED_TABLE_FUNCTIONS = {"range", "generate_series", "unnest"}
FORBIDDEN_NODES = (exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop, exp.Alter,
                   exp.Command, exp.Set, exp.Pragma, exp.Copy, exp.Attach, exp.Detach,
                   exp.Merge, exp.Use, exp.Transaction, exp.Commit, exp.Rollback, exp.Into,
                   exp.LoadData, exp.Export)
TOO_DEEP = "sql is nested too deeply (parentheses, brackets or subqueries)"
# Parsing is not under the time limit (and runs twice): a megabyte of SQL would cost seconds of
# CPU per request. Catalog queries are short.
MAX_SQL_CHARS = 64 * 1024


def _function_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def check_function(name: str) -> None:
    if name in FORBIDDEN_FUNCTIONS or name.startswith(FORBIDDEN_PREFIXES):
        raise InvalidRequest(f"function {name}() is not allowed (no file or network access, no "
                             "settings, state or metadata)", field="sql")


def check_table_function(name: str) -> None:
    if name not in ALLOWED_TABLE_FUNCTIONS:
        raise InvalidRequest(f"table function {name}() is not allowed; query the catalog's "
                             "tables", field="sql")


def check_table_name(name: str, schema: str, has_catalog: bool, shown: str,
                     tables: Collection[str], ctes: Collection[str]) -> None:
    """A named FROM item is a CTE in scope (unqualified) or a catalog table or view (schema
    empty or `main`); anything else (system views, information_schema, pg_catalog) is refused."""
    if has_catalog:
        raise InvalidRequest(f"table {shown!r} names another database", field="sql")
    if schema not in ("", "main"):
        raise InvalidRequest(f"schema of {shown!r} is not part of the catalog", field="sql")
    if (not schema and name in ctes) or name in tables:
        return
    listed = ", ".join(sorted(tables)[:40])
    raise InvalidRequest(f"table {shown!r} is not a catalog table (tables: {listed})",
                         field="sql")


def _check_table(node: exp.Table, tables: Collection[str] | None, ctes: frozenset[str]) -> None:
    if isinstance(node.this, exp.Literal):
        raise InvalidRequest(f"reading files ({node.this.sql()}) is not allowed", field="sql")
    if tables is None:
        return
    if isinstance(node.this, exp.Func):
        check_table_function(_function_name(node.this))
        return
    check_table_name(node.name.lower(), node.db.lower(), bool(node.catalog), node.sql(),
                     tables, ctes)


def check_readonly(sql: str, tables: Collection[str] | None = None) -> None:
    """InvalidRequest unless `sql` is exactly one SELECT (or WITH ... SELECT); with `tables`
    (lower-case names of the catalog's tables and views), FROM items are also restricted to
    those, the CTEs in scope where they are used, and ALLOWED_TABLE_FUNCTIONS."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidRequest("sql is empty", field="sql")
    if len(sql) > MAX_SQL_CHARS:
        raise InvalidRequest(f"sql is {len(sql)} characters long, over the {MAX_SQL_CHARS} "
                             "limit", field="sql")
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
        if len(statements) != 1:
            raise InvalidRequest(f"exactly one statement is allowed, got {len(statements)}",
                                 field="sql")
        (tree,) = statements
        if not isinstance(tree, exp.Query):
            raise InvalidRequest(f"only SELECT queries are allowed, not {tree.key.upper()}",
                                 field="sql")
        _walk_sqlglot(cast(exp.Expression, tree), frozenset(), tables)
    except (ParseError, sqlglot.errors.TokenError) as e:
        raise InvalidRequest(f"sql does not parse: {str(e).splitlines()[0]}", field="sql") from None
    except RecursionError:  # sqlglot recurses once per nesting level
        raise InvalidRequest(TOO_DEEP, field="sql") from None


def _with_clause(node: exp.Expression) -> exp.With | None:
    w = node.args.get("with_", node.args.get("with"))
    return w if isinstance(w, exp.With) else None


def _walk_sqlglot(root: exp.Expression, visible: frozenset[str],
                  tables: Collection[str] | None) -> None:
    """Check every node; a CTE's name is visible in the later CTEs of its WITH and in the query
    that WITH belongs to (in a recursive CTE, also in the recursive part of its own body)."""
    stack: list[tuple[exp.Expression, frozenset[str]]] = [(root, visible)]
    while stack:
        node, ctes = stack.pop()
        _check_node(node, tables, ctes)
        w = _with_clause(node)
        if w is not None:
            inner = set(ctes)
            for cte in w.expressions:
                name = cte.alias_or_name.lower()
                body = cte.this
                if w.args.get("recursive") and isinstance(body, exp.SetOperation):
                    stack.append((body.this, frozenset(inner)))
                    stack.append((body.expression, frozenset(inner | {name})))
                    _check_node(body, tables, frozenset(inner))
                    for k, v in body.args.items():
                        if k not in ("this", "expression"):
                            stack.extend((c, frozenset(inner)) for c in _children(v))
                else:
                    stack.append((body, frozenset(inner)))
                inner.add(name)
            ctes = frozenset(inner)
        for value in node.args.values():
            if w is None or value is not w:
                stack.extend((c, ctes) for c in _children(value))


def _children(value: Any) -> list[exp.Expression]:
    if isinstance(value, exp.Expression):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, exp.Expression)]
    return []


def _check_node(node: exp.Expression, tables: Collection[str] | None,
                ctes: frozenset[str]) -> None:
    if isinstance(node, FORBIDDEN_NODES):
        raise InvalidRequest(f"{node.key.upper()} is not allowed in a read-only query",
                             field="sql")
    if isinstance(node, exp.Func):
        check_function(_function_name(node))
    if isinstance(node, exp.Table):
        _check_table(node, tables, ctes)


def check_duckdb_tree(raw: duckdb.DuckDBPyConnection, sql: str,
                      tables: Collection[str]) -> None:
    """The checks of check_readonly again, with DuckDB's own parser and parse tree
    (json_serialize_sql): a query that sqlglot and DuckDB read differently cannot slip a
    statement, function or table past."""
    try:
        statements = raw.extract_statements(sql)
    except duckdb.Error as e:
        raise InvalidRequest(f"sql does not parse: {str(e).splitlines()[0]}", field="sql") from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise InvalidRequest("only one SELECT query is allowed", field="sql")
    stack: list[tuple[Any, frozenset[str]]] = [(_duckdb_tree(raw, sql), frozenset())]
    while stack:
        n, ctes = stack.pop()
        if isinstance(n, list):
            stack.extend((v, ctes) for v in n)
            continue
        if not isinstance(n, dict):
            continue
        ctes = _push_ctes(n, ctes, stack)
        if n.get("type") == "RECURSIVE_CTE_NODE":  # its name is visible in the recursive part
            own = frozenset(ctes | {str(n.get("cte_name", "")).lower()})
            stack.append((n.get("right"), own))
            stack.extend((v, ctes) for k, v in n.items() if k not in ("right", "cte_map"))
            continue
        _check_duckdb_node(n, tables, ctes)
        stack.extend((v, ctes) for k, v in n.items() if k != "cte_map")


def _duckdb_tree(raw: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of `sql` (json_serialize_sql); InvalidRequest if it has none."""
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
    return doc


def _push_ctes(n: dict[str, Any], ctes: frozenset[str],
               stack: list[tuple[Any, frozenset[str]]]) -> frozenset[str]:
    """Push the bodies of node n's WITH entries, each seeing the ones before it; the CTE names
    visible in the rest of n."""
    cte_map = n.get("cte_map")
    entries = cte_map.get("map") if isinstance(cte_map, dict) else None
    if not entries:
        return ctes
    inner = set(ctes)
    for entry in entries if isinstance(entries, list) else [entries]:
        if not isinstance(entry, dict):
            stack.append((entry, frozenset(inner)))
            continue
        stack.append((entry.get("value"), frozenset(inner)))
        inner.add(str(entry.get("key", "")).lower())
    return frozenset(inner)


def _check_duckdb_node(n: dict[str, Any], tables: Collection[str], ctes: frozenset[str]) -> None:
    kind = n.get("type")
    if n.get("class") in ("FUNCTION", "WINDOW", "AGGREGATE") and "function_name" in n:
        check_function(str(n["function_name"]).lower())
    if kind == "TABLE_FUNCTION":
        fn = n.get("function")
        name = fn.get("function_name", "?") if isinstance(fn, dict) else "?"
        check_table_function(str(name).lower())
    if kind in ("BASE_TABLE", "SHOW_REF") and n.get("table_name"):
        check_table_name(str(n["table_name"]).lower(), str(n.get("schema_name") or "").lower(),
                         bool(n.get("catalog_name")), str(n["table_name"]), tables, ctes)
