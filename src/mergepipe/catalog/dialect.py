"""Every difference between the DuckDB and PostgreSQL catalogs: the rewrites every statement
gets on PostgreSQL (`to_postgres`); the DuckDB functions the planner uses are defined there by
sql/postgres_prelude.sql."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mergepipe.core.settings import CATALOG_URL_SCHEMES as POSTGRES_SCHEMES

# Statement rewrites (compiled SQL, after parameters became %(name)s).
_DOUBLE = re.compile(r"\bDOUBLE\b(?!\s+PRECISION)", re.IGNORECASE)
# The bulk inserts `INSERT INTO t (cols) SELECT %(scalar)s, unnest(%(list)s), ...` (one
# parameter list per column): PostgreSQL's unnest flattens lists of lists and cannot type a
# list of NULLs, so there the rows are sent with executemany instead.
_UNNEST_INSERT = re.compile(
    r"^\s*(?:--[^\n]*\n\s*)*INSERT INTO (\w+) \(([^)]*)\)\s*SELECT\s+(.*?)\s*$", re.DOTALL)
_SELECT_ITEM = re.compile(r"^(?:unnest\(%\((\w+)\)s\)|%\((\w+)\)s)$")
# DuckDB's list_contains(list parameter, column) (a filter on a short list of names, planned in
# a fraction of `IN (SELECT UNNEST(...))`'s time): PostgreSQL's `column = ANY(list)`.
_LIST_CONTAINS = re.compile(r"\blist_contains\((CAST\(%\(\w+\)s AS \w+\[\]\)), ([\w.]+)\)")
_CREATE_OR_REPLACE_TEMP = re.compile(
    r"\bCREATE\s+OR\s+REPLACE\s+TEMP(?:ORARY)?\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def is_postgres(location: str | Path) -> bool:
    """Whether a catalog location (MERGEPIPE_CATALOG, --catalog) names a PostgreSQL database."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def engine_url(location: str | Path) -> str:
    """The SQLAlchemy URL of a PostgreSQL catalog location."""
    return "postgresql+psycopg://" + str(location).split("://", 1)[1]


def display(location: str | Path) -> str:
    """The location without a password, for messages and logs."""
    if not is_postgres(location):
        return str(location)
    import sqlalchemy as sa  # only PostgreSQL catalogs go through SQLAlchemy

    return sa.engine.make_url(engine_url(location)).render_as_string(hide_password=True)


def to_postgres(statement: str) -> tuple[list[str], str]:
    """(statements to run first, the statement in PostgreSQL's spelling). DuckDB's
    `CREATE OR REPLACE TEMP TABLE t AS ... FROM t` reads the old t while it makes the new one:
    on PostgreSQL the old one is renamed to t__prev first and read under that name."""
    before: list[str] = []
    m = _CREATE_OR_REPLACE_TEMP.search(statement)
    if m:
        name, body = m.group(1), statement[m.end():]
        reads_itself = re.compile(rf"\b{name}\b")
        if reads_itself.search(body):
            before = [f"DROP TABLE IF EXISTS pg_temp.{name}__prev",
                      f"ALTER TABLE IF EXISTS pg_temp.{name} RENAME TO {name}__prev"]
            body = reads_itself.sub(f"{name}__prev", body)
        else:
            before = [f"DROP TABLE IF EXISTS pg_temp.{name}"]
        statement = statement[:m.start()] + f"CREATE TEMP TABLE {name}" + body
    statement = _LIST_CONTAINS.sub(r"(\2 = ANY(\1))", statement)
    return before, _DOUBLE.sub("DOUBLE PRECISION", statement)


def unnest_rows(statement: str, parameters: Any) -> tuple[str, list[tuple[Any, ...]]] | None:
    """(INSERT ... VALUES statement, rows) for a columnar unnest insert, else None."""
    m = _UNNEST_INSERT.match(statement)
    if m is None or "unnest(" not in m.group(3) or not isinstance(parameters, dict):
        return None
    items = [_SELECT_ITEM.match(x.strip()) for x in m.group(3).split(",")]
    if not all(items):
        return None
    columns = [(i.group(1), i.group(2)) for i in items if i is not None]
    n = len(parameters[next(c for c, _ in columns if c)])
    rows = [tuple(parameters[c][k] if c else parameters[s] for c, s in columns)
            for k in range(n)]
    values = ", ".join(["%s"] * len(columns))
    return f"INSERT INTO {m.group(1)} ({m.group(2)}) VALUES ({values})", rows
