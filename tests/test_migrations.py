"""Applying migrations/ in order to an empty catalog gives exactly catalog_schema.sql."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import duckdb
import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import (
    MIGRATIONS_PACKAGE,
    Catalog,
    migrations,
    schema_sql,
    split_statements,
)

pytestmark = pytest.mark.duckdb_only(
    "DuckDB files and duckdb_* introspection; the PostgreSQL schema is compared in "
    "tests/test_postgres_catalog.py")

COLUMNS = """SELECT table_name, column_index, column_name, data_type, is_nullable, column_default
             FROM duckdb_columns() WHERE NOT internal ORDER BY table_name, column_index"""
CONSTRAINTS = """SELECT table_name, constraint_type, list_sort(constraint_column_names),
                        constraint_text
                 FROM duckdb_constraints() ORDER BY ALL"""
TABLES = "SELECT table_name FROM duckdb_tables() WHERE NOT internal ORDER BY table_name"
INDEXES = "SELECT table_name, index_name, sql FROM duckdb_indexes() ORDER BY ALL"
VIEWS = "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
SEQUENCES = "SELECT sequence_name, start_value, increment_by FROM duckdb_sequences() ORDER BY ALL"


def _schema(path: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {name: con.execute(q).fetchall() for name, q in (
            ("tables", TABLES), ("columns", COLUMNS), ("constraints", CONSTRAINTS),
            ("indexes", INDEXES), ("views", VIEWS), ("sequences", SEQUENCES))}
    finally:
        con.close()


@pytest.fixture
def migrated(tmp_path: Path) -> Path:
    path = tmp_path / "migrated.duckdb"
    Catalog(path).close()
    return path


@pytest.fixture
def from_schema(tmp_path: Path) -> Path:
    path = tmp_path / "schema.duckdb"
    con = duckdb.connect(str(path))
    for stmt in split_statements(schema_sql()):
        con.execute(stmt)
    con.close()
    return path


def test_migrations_equal_the_schema_file(migrated: Path, from_schema: Path) -> None:
    got, want = _schema(migrated), _schema(from_schema)
    assert got["tables"] == want["tables"]
    for part in ("columns", "constraints", "indexes", "views", "sequences"):
        assert got[part] == want[part], part
    tables = {t for (t,) in want["tables"]}
    assert {"models", "files", "tensors", "blocks", "block_stats", "tensor_stats", "merges",
            "touched_blocks", "lineage", "schema_migrations"} <= tables


def test_schema_columns_are_compared(migrated: Path) -> None:
    """The comparison sees types, nullability, defaults and keys (it can fail)."""
    s = _schema(migrated)
    cols = {(t, c): (ty, null, default) for t, _, c, ty, null, default in s["columns"]}
    assert cols[("tensors", "shape")] == ("BIGINT[]", False, None)
    assert cols[("tensors", "lora_scale")] == ("DOUBLE", True, None)
    assert cols[("models", "created_at")][2] is not None
    assert ("blocks", "PRIMARY KEY", ["block_index", "model", "tensor"],
            "PRIMARY KEY(model, tensor, block_index)") in s["constraints"]


def test_migrations_are_recorded_and_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "c.duckdb"
    cat = Catalog(path)
    try:
        assert cat.migrate() == []
        recorded = [(r.version, r.name) for r in
                    cat.query(SQL("SELECT version, name FROM schema_migrations ORDER BY 1"))]
        assert recorded == [(v, n) for v, n, _ in migrations()]
    finally:
        cat.close()


def test_migration_files_are_numbered_without_gaps_or_duplicates() -> None:
    names = sorted(p.name for p in files(MIGRATIONS_PACKAGE).iterdir()
                   if p.name.endswith(".sql") and p.name != "catalog_schema.sql")
    assert names and all(re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", f) for f in names), names
    versions = [int(f[:4]) for f in names]
    # unique and starting at 1 (a branch's assigned number may leave a gap until it is merged)
    assert versions[0] == 1 and len(set(versions)) == len(versions), names


def test_upgrade_keeps_rows(tmp_path: Path) -> None:
    """A catalog made by the first migration keeps its rows when brought up to date."""
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT "
                "NULL, applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)")
    (version, name, first) = migrations()[0]
    for stmt in split_statements(first.read_text()):
        con.execute(stmt)
    con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
    con.execute("INSERT INTO tensors (model, tensor, ordinal, file_index, dtype, shape, "
                "data_offset, nbytes, n_blocks) VALUES ('m', 't', 0, 0, 'F32', [2, 3], 8, 24, 1)")
    con.close()
    Catalog(path).close()
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert con.execute("SELECT tensor, shape, lora_scale FROM tensors").fetchall() == [
            ("t", [2, 3], None)]
    finally:
        con.close()
    fresh = tmp_path / "fresh.duckdb"
    Catalog(fresh).close()
    assert _schema(path)["columns"] == _schema(fresh)["columns"]
