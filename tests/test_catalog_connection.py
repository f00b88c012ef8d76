"""catalog.connection over the suite's catalog engine (DuckDB, or PostgreSQL under make test-pg):
`:name` parameters, rows by name and position, transactions, constraint errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL, IntegrityError, Row, row_type
from mergepipe.catalog.db import Catalog, CatalogUnreadable
from tests.catalogs import new_catalog

CREATE = SQL("CREATE TABLE t (k INTEGER PRIMARY KEY, name VARCHAR, x DOUBLE)")
INSERT = SQL("INSERT INTO t (k, name, x) VALUES (:k, :name, :x)")
ALL = SQL("SELECT k, name, x FROM t ORDER BY k")


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog(new_catalog(tmp_path)) as c:
        c.execute(CREATE)
        yield c


def test_named_parameters_become_the_engines_own() -> None:
    s = SQL("SELECT :a, CAST(:b AS INTEGER), k::INTEGER, 'x\\:y', :a WHERE 1 = :c")
    assert s.names == ("a", "b", "c")  # in order of first use, each once
    assert s.numbered == "SELECT $1, CAST($2 AS INTEGER), k::INTEGER, 'x:y', $1 WHERE 1 = $3"
    assert s.values({"c": 3, "a": 1, "b": 2, "unused": 9}) == [1, 2, 3]
    with pytest.raises(KeyError, match=":b"):
        s.values({"a": 1, "c": 3})


def test_a_repeated_parameter_binds_one_value(cat: Catalog) -> None:
    assert cat.query(SQL("SELECT :v + 1 AS a, :v * 2 AS b, 'x::y' AS c"),
                     {"v": 20}) == [(21, 40, "x::y")]


def test_rows_read_by_column_name_and_position(cat: Catalog) -> None:
    cat.execute(INSERT, [{"k": 1, "name": "a", "x": 0.5}, {"k": 2, "name": None, "x": 2.0}])
    rows = cat.query(ALL)
    assert rows == [(1, "a", 0.5), (2, None, 2.0)]
    assert [r.name for r in rows] == ["a", None] and rows[1][2] == 2.0
    assert rows[0]._mapping == {"k": 1, "name": "a", "x": 0.5}
    with pytest.raises(AttributeError, match="no column 'y'"):
        _ = rows[0].y
    with cat.reader() as conn:
        res = conn.execute(ALL)
        assert res.mappings()[0] == {"k": 1, "name": "a", "x": 0.5}
        assert res.tuples() == [(1, "a", 0.5), (2, None, 2.0)]
        assert type(res.tuples()[0]) is tuple
        assert conn.execute(SQL("SELECT count(*) FROM t")).scalar_one() == 2


def test_an_update_reports_the_rows_it_changed(cat: Catalog) -> None:
    cat.execute(INSERT, [{"k": k, "name": "a", "x": 0.0} for k in range(5)])
    with cat.transaction() as conn:
        assert conn.execute(SQL("UPDATE t SET x = 1 WHERE k >= :k"), {"k": 2}).rowcount == 3
        assert conn.execute(SQL("UPDATE t SET x = 1 WHERE k > 9")).rowcount == 0


def test_a_broken_key_is_an_integrity_error_and_nothing_of_the_transaction_stays(
        cat: Catalog) -> None:
    cat.execute(INSERT, {"k": 1, "name": "a", "x": 0.0})
    with pytest.raises(IntegrityError), cat.transaction() as conn:
        conn.execute(INSERT, {"k": 2, "name": "b", "x": 0.0})
        conn.execute(INSERT, {"k": 1, "name": "again", "x": 0.0})
    assert cat.query(ALL) == [(1, "a", 0.0)]


def test_a_transaction_commits_only_at_its_end(cat: Catalog) -> None:
    with cat.transaction() as conn:
        conn.execute(INSERT, {"k": 7, "name": "n", "x": 1.0})
        assert cat.query(ALL) == []  # another connection does not see it yet
    assert cat.query(ALL) == [(7, "n", 1.0)]
    with pytest.raises(RuntimeError), cat.transaction() as conn:
        conn.execute(INSERT, {"k": 8, "name": "n", "x": 1.0})
        raise RuntimeError("the caller fails")
    assert [r.k for r in cat.query(ALL)] == [7]


def test_an_empty_list_of_parameter_sets_runs_nothing(cat: Catalog) -> None:
    cat.execute(INSERT, [])
    assert cat.query(ALL) == []


def test_equal_column_names_read_the_first() -> None:
    row = row_type(("a", "b", "a"))((1, 2, 3))
    assert isinstance(row, Row) and row.a == 1 and row.b == 2 and tuple(row) == (1, 2, 3)


@pytest.mark.duckdb_only("a DuckDB catalog file")
def test_a_file_that_is_no_duckdb_database_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_text("not a database\n" * 1000)
    with pytest.raises(CatalogUnreadable, match="notes.duckdb"):
        Catalog(path)
    assert path.read_text() == "not a database\n" * 1000  # untouched
