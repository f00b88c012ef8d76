"""Fuzzing the SQL guard with nested scopes: a CTE's name stands for that CTE only where it is
in scope; anywhere else the same name is DuckDB's system view (settings, the catalog's path)
and must be refused by the guard, which reads DuckDB's own parse tree."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import SELECT_TABLES
from mergepipe.sandbox.sql_guard import check_query
from mergepipe.sandbox.user_sql import run_readonly

pytestmark = pytest.mark.duckdb_only("the guard over DuckDB's parse tree and system views")

# System views that leak settings or the catalog's file path, and one name that is nothing.
NAMES = ["pg_settings", "duckdb_settings", "duckdb_databases", "pragma_database_list", "a"]


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Catalog, set[str]]]:
    with Catalog(tmp_path_factory.mktemp("scopes") / "catalog.duckdb") as c:
        with c.duckdb_reader() as raw:
            tables = {str(r[0]).lower() for r in raw.execute(SELECT_TABLES).fetchall()}
        yield c, tables


@st.composite
def query(draw: st.DrawFn, visible: frozenset[str] = frozenset(), depth: int = 0
          ) -> tuple[str, bool]:
    """(sql, every name is a CTE in scope where it is used). Every query has one column `m`,
    which no system view has: a name DuckDB resolves to a system view fails to bind."""
    kinds = ["ref", "const"] + (["with", "sub", "join", "union", "exists", "scalar"]
                                if depth < 4 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "const":
        return "SELECT 1 AS m", True
    if kind == "ref":
        name = draw(st.sampled_from(NAMES))
        return f"SELECT m FROM {name}", name in visible
    if kind == "with":
        names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
        inner, parts, ok = set(visible), [], True
        for name in names:
            q, q_ok = draw(query(frozenset(inner), depth + 1))
            parts.append(f"{name} AS ({q})")
            ok &= q_ok
            inner.add(name)
        body, b_ok = draw(query(frozenset(inner), depth + 1))
        return f"WITH {', '.join(parts)} SELECT m FROM ({body}) AS w{depth}", ok and b_ok
    q1, ok1 = draw(query(visible, depth + 1))
    if kind == "sub":
        return f"SELECT m FROM ({q1}) AS s{depth}", ok1
    if kind == "exists":
        return f"SELECT 1 AS m WHERE EXISTS ({q1})", ok1
    if kind == "scalar":
        return f"SELECT (SELECT min(m) FROM ({q1}) AS s{depth}) AS m", ok1
    if kind == "join":
        name = draw(st.sampled_from(NAMES))
        return (f"SELECT y{depth}.m FROM ({q1}) AS x{depth}, {name} AS y{depth}",
                ok1 and name in visible)
    q2, ok2 = draw(query(visible, depth + 1))
    return f"SELECT m FROM ({q1}) UNION ALL SELECT m FROM ({q2})", ok1 and ok2


def _refused(check: object, *args: object) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except InvalidRequest:
        return True
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query())
def test_names_resolve_by_scope(cat: tuple[Catalog, set[str]], q: tuple[str, bool]) -> None:
    c, tables = cat
    sql, in_scope = q
    with c.duckdb_reader() as raw:
        assert _refused(check_query, raw, sql, tables) == (not in_scope), sql
    if in_scope:  # DuckDB agrees: every name bound to its CTE (a system view has no `m`)
        try:
            run_readonly(c, sql, SqlLimits(timeout_s=10))
        except InvalidRequest as e:  # a CTE naming an outer CTE inside its own body
            assert "Circular reference" in e.message, (sql, e.message)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM (WITH pg_settings AS (SELECT 1) SELECT 1) t, pg_settings",
    "SELECT * FROM (WITH duckdb_databases AS (SELECT 1) SELECT 1) t, duckdb_databases",
    "SELECT * FROM (WITH pragma_database_list AS (SELECT 1) SELECT 1) t, pragma_database_list",
    "SELECT * FROM (WITH duckdb_settings AS (SELECT 1) SELECT * FROM duckdb_settings) t, "
    "duckdb_settings",
])
def test_the_issues_examples_reveal_nothing(cat: tuple[Catalog, set[str]], sql: str) -> None:
    """On 0.1 these returned every DuckDB setting and the catalog's file path."""
    c, _ = cat
    with pytest.raises(InvalidRequest, match="not a catalog table") as err:
        run_readonly(c, sql, SqlLimits(timeout_s=5))
    assert str(c.path) not in err.value.message
