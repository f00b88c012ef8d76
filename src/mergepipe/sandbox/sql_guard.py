"""The user-SQL guard, on DuckDB's own parse tree (json_serialize_sql, which serializes nothing
but SELECT): one SELECT whose every function is on the allow-list (allowed_functions.py) and
whose every table is a catalog table, or a CTE where its name is in scope."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import InvalidRequest
from mergepipe.sandbox.allowed_functions import (
    AGGREGATE,
    ALLOWED,
    BY_AGGREGATE_NAME,
    KEYWORD_CALLS,
    TABLE,
)

TOO_DEEP = "sql is nested too deeply (parentheses, brackets or subqueries)"
# Parsing is not under the time limit: a megabyte of SQL would cost seconds of CPU per request.
# Catalog queries are short.
MAX_SQL_CHARS = 64 * 1024
MAX_NESTING = 100  # parentheses and brackets deep (catalog queries need far fewer)
# DuckDB parses the DESCRIBE, SUMMARIZE, SHOW and VALUES statements to a SELECT from these.
STATEMENT_REFS = ("SHOW_REF", "EXPRESSION_LIST")


def refuse(message: str) -> InvalidRequest:
    return InvalidRequest(message, field="sql")


def check_query(conn: duckdb.DuckDBPyConnection, sql: str, tables: Collection[str]) -> None:
    """Refuse (InvalidRequest naming the `sql` field) anything but one SELECT that calls only
    allowed functions and reads only `tables` and the CTEs in scope."""
    if not isinstance(sql, str) or not sql.strip():
        raise refuse("sql is empty")
    if len(sql) > MAX_SQL_CHARS:
        raise refuse(f"sql is {len(sql)} characters long, over the {MAX_SQL_CHARS} limit")
    _check_nesting(sql)
    statements = parse(conn, sql)
    if len(statements) != 1:
        raise refuse(f"exactly one statement is allowed, got {len(statements)}")
    top = statements[0] if isinstance(statements[0], dict) else {}
    if (top.get("from_table") or {}).get("type") in STATEMENT_REFS:
        raise refuse("DESCRIBE, SUMMARIZE, SHOW and VALUES statements are not allowed; "
                     "query them as a table, e.g. SELECT * FROM (DESCRIBE models)")
    stack: list[tuple[Any, frozenset[str]]] = [(statements[0], frozenset())]
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
        _check_node(n, tables, ctes)
        stack.extend((v, ctes) for k, v in n.items() if k != "cte_map")


def _check_nesting(sql: str) -> None:
    """At most MAX_NESTING parentheses or brackets deep (counted over DuckDB's own tokens:
    those in strings and comments do not count)."""
    tokens = duckdb.tokenize(sql)
    depth = 0
    for (start, kind), (end, _) in zip(tokens, [*tokens[1:], (len(sql), None)], strict=True):
        if kind != duckdb.token_type.operator:
            continue
        for ch in sql[start:end]:
            depth += (ch in "([") - (ch in ")]")
            if depth > MAX_NESTING:
                raise refuse(TOO_DEEP)


def parse(conn: duckdb.DuckDBPyConnection, sql: str) -> list[Any]:
    """DuckDB's parse tree of each statement of `sql`; refused if one is not a SELECT."""
    try:
        row = conn.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()
        doc = json.loads(row[0]) if row else None
    except RecursionError:  # json.loads recurses once per level
        raise refuse(TOO_DEEP) from None
    except (duckdb.Error, ValueError, TypeError) as e:
        raise refuse(f"sql does not parse: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("error"):
        msg = doc.get("error_message") if isinstance(doc, dict) else None
        if msg == "Only SELECT statements can be serialized to json!":
            msg = "only SELECT queries are allowed"
        raise refuse(f"sql is not one plain SELECT: {msg or 'unreadable'}")
    return [s.get("node") for s in doc.get("statements") or []]


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


def _check_node(n: dict[str, Any], tables: Collection[str], ctes: frozenset[str]) -> None:
    kind = n.get("type")
    if n.get("class") in ("FUNCTION", "WINDOW", "AGGREGATE") and "function_name" in n:
        check_function(n)
    elif n.get("class") == "COLUMN_REF":
        names = n.get("column_names") or [""]
        call = KEYWORD_CALLS.get(str(names[-1]).lower())
        if call is not None and call not in ALLOWED:
            raise refuse(f"{names[-1]} (the function {call}()) is not allowed in catalog "
                         "queries")
    elif kind == "TABLE_FUNCTION":
        fn = n.get("function")
        name = str(fn.get("function_name", "?") if isinstance(fn, dict) else "?").lower()
        if name not in TABLE:
            raise refuse(f"table function {name}() is not allowed; query the catalog's tables "
                         f"(allowed table functions: {', '.join(sorted(TABLE))})")
    elif kind in ("BASE_TABLE", "SHOW_REF") and n.get("table_name"):
        check_table_name(str(n["table_name"]).lower(), str(n.get("schema_name") or "").lower(),
                         bool(n.get("catalog_name")), str(n["table_name"]), tables, ctes)


def check_function(n: dict[str, Any]) -> None:
    """A call of an allowed function, by its plain name; an aggregate named by a string (as
    list_aggr takes it) allowed too."""
    name = str(n["function_name"]).lower()
    if n.get("schema") or n.get("catalog"):
        raise refuse(f"function {name}() is called by a qualified name; call it by its own")
    if name not in ALLOWED:
        raise refuse(f"function {name}() is not allowed in catalog queries (it is not on the "
                     "SQL sandbox's list of allowed functions)")
    if name in BY_AGGREGATE_NAME:
        args = n.get("children") or [a.get("expression") for a in n.get("arguments") or []]
        agg = _string_constant(args[1]).lower() if len(args) > 1 else ""
        if agg not in AGGREGATE:
            raise refuse(f"{name}() names the aggregate {agg or '(not a constant)'!r}, which is "
                         "not allowed in catalog queries")


def _string_constant(node: Any) -> str:
    """The text of a string constant in DuckDB's tree ("" for anything else)."""
    if not isinstance(node, dict) or node.get("class") != "CONSTANT":
        return ""
    literal, value = node.get("literal"), node.get("value")
    if isinstance(literal, dict) and literal.get("kind") == "STRING":  # DuckDB 2
        return str(literal.get("text", ""))
    if isinstance(value, dict) and isinstance(value.get("value"), str):  # DuckDB 1
        return str(value["value"])
    return ""


def check_table_name(name: str, schema: str, has_catalog: bool, shown: str,
                     tables: Collection[str], ctes: Collection[str]) -> None:
    """A named FROM item is a CTE in scope (unqualified) or a catalog table or view (schema
    empty or `main`); anything else (system views, information_schema, files) is refused."""
    if has_catalog:
        raise refuse(f"table {shown!r} names another database")
    if schema not in ("", "main"):
        raise refuse(f"schema of {shown!r} is not part of the catalog")
    if (not schema and name in ctes) or name in tables:
        return
    listed = ", ".join(sorted(tables)[:40])
    raise refuse(f"table {shown!r} is not a catalog table (tables: {listed})")
