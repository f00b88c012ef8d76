"""The one seam to the catalog database: a DuckDB file through DuckDB's own API, or PostgreSQL
through SQLAlchemy, both behind catalog.connection's statements and rows."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mergepipe.catalog import dialect
from mergepipe.catalog.connection import (
    SQL,
    CatalogUnavailable,
    Connection,
    Result,
    Row,
    first_line,
)
from mergepipe.catalog.duckdb_database import DuckDBDatabase, read_only_error
from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import Conflict, MergePipeError

if TYPE_CHECKING:
    from mergepipe.catalog.postgres_database import PostgresDatabase

MIGRATIONS_PACKAGE = "mergepipe.migrations"  # NNNN_name.sql files and catalog_schema.sql
SCHEMA_FILE_NAME = "catalog_schema.sql"  # what the migrations, applied in order, produce
SQL_PACKAGES = ["mergepipe.catalog"]  # packages whose sql/NAME.sql files load_sql finds

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@cache
def load_sql(name: str) -> SQL:
    """The named statement from a `sql/NAME.sql` file (bound parameters as `:name`)."""
    for package in SQL_PACKAGES:
        f = files(package).joinpath("sql", f"{name}.sql")
        if f.is_file():
            return SQL(f.read_text())
    raise KeyError(f"no SQL file named {name!r} in the sql/ folders of {SQL_PACKAGES}")


def register_sql_package(package: str) -> None:
    """Let another package (planner, service) keep its SQL files in its own sql/ folder."""
    if package not in SQL_PACKAGES:
        SQL_PACKAGES.append(package)


def split_statements(script: str) -> list[str]:
    """Split a schema/migration script on `;` at line ends (our files keep one per line end)."""
    no_comments = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
    return [s.strip() for s in no_comments.split(";") if s.strip()]


def migrations() -> list[tuple[int, str, Traversable]]:
    """(version, name, file) of the numbered migrations shipped in the package, in order."""
    out = []
    for f in files(MIGRATIONS_PACKAGE).iterdir():
        m = _MIGRATION_NAME.match(f.name)
        if m:
            out.append((int(m.group(1)), m.group(2), f))
    if not out:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_PACKAGE}: the installation is "
                           "incomplete (the package data was not installed)")
    return sorted(out, key=lambda v: v[0])


def schema_sql() -> str:
    """catalog_schema.sql: the schema the migrations produce, applied in order."""
    return files(MIGRATIONS_PACKAGE).joinpath(SCHEMA_FILE_NAME).read_text()


class CatalogInUse(Conflict):
    """Another process holds the catalog file (DuckDB allows one read-write process)."""


class CatalogUnreadable(MergePipeError):
    """The catalog file cannot be opened as a DuckDB database (another kind of file, a newer
    DuckDB's format, no permission)."""

    code = "catalog_unreadable"


class Catalog:
    """A catalog database. Threads share it; each `transaction()` uses its own connection.

    `location` is a DuckDB file path or a `postgresql://user@host:port/db` URL."""

    def __init__(self, location: str | Path, *, migrate: bool = True) -> None:
        self.location: str | Path = location if dialect.is_postgres(location) else Path(location)
        self.postgres = dialect.is_postgres(location)
        self.path = Path(location) if not self.postgres else None
        # DuckDB: one writer at a time in this process; PostgreSQL takes row locks itself.
        self._write_lock = threading.RLock()
        self.database: DuckDBDatabase | PostgresDatabase
        if self.path is not None:
            self.database = _open_duckdb(self.path)
        else:
            from mergepipe.catalog.postgres_database import PostgresDatabase

            self.database = PostgresDatabase(str(location), pool_size=8, max_overflow=16)
        if migrate:
            try:
                if not self.up_to_date():
                    self.migrate()
            except Exception as e:
                self.close()
                if self.postgres and (isinstance(e, CatalogUnavailable) or _unreachable(e)):
                    cause = e.__cause__ if isinstance(e, CatalogUnavailable) else e
                    raise CatalogUnavailable(
                        f"cannot use the PostgreSQL catalog {dialect.display(location)}: "
                        f"{first_line(getattr(cause, 'orig', cause))}") from None
                raise

    @property
    def engine(self) -> Any:
        """The SQLAlchemy engine of a PostgreSQL catalog (its reader role's sessions use it)."""
        from mergepipe.catalog.postgres_database import PostgresDatabase

        assert isinstance(self.database, PostgresDatabase), "a DuckDB catalog has no engine"
        return self.database.engine

    def close(self) -> None:
        self.database.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- migrations ---------------------------------------------------------------------------
    def up_to_date(self) -> bool:
        """Whether every shipped migration is applied: two read-only queries (what opening a
        current catalog costs)."""
        with self.reader() as conn:
            if not conn.execute(load_sql("schema_migrations_exists")).rows:
                return False  # a new catalog
            done = {r[0] for r in conn.execute(load_sql("schema_migrations_applied"))}
        return all(version in done for version, _, _ in migrations())

    def migrate(self) -> list[int]:
        """Apply the pending numbered migrations in order; returns the versions applied."""
        applied_now = []
        with self.transaction() as conn:
            if self.postgres:
                conn.execute(load_sql("migration_lock"))
                for stmt in split_statements(load_sql("postgres_prelude").text):
                    conn.execute(SQL(stmt))
            conn.execute(load_sql("schema_migrations_create"))
            done = {r[0] for r in conn.execute(load_sql("schema_migrations_applied"))}
            for version, name, path in migrations():
                if version in done:
                    continue
                for stmt in split_statements(path.read_text()):
                    conn.execute(SQL(stmt))
                conn.execute(load_sql("schema_migration_insert"), {"version": version, "name": name})
                applied_now.append(version)
        return applied_now

    # -- access -------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One atomic unit of work: commits on success, rolls back on any error."""
        if self.postgres:
            with self.database.begin() as conn:
                yield conn
            return
        with self._write_lock, self.database.begin() as conn:
            yield conn

    @contextmanager
    def reader(self) -> Iterator[Connection]:
        """A read transaction: one consistent view of the catalog."""
        with self.database.connect() as conn:
            yield conn

    @contextmanager
    def duckdb_reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """DuckDB's own connection in a read transaction (user SQL and its snapshot copies)."""
        assert isinstance(self.database, DuckDBDatabase), "a PostgreSQL catalog has none"
        with self.database.connect() as conn:
            yield conn.raw

    @contextmanager
    def duckdb_connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A DuckDB connection of its own, closed when the block ends; closing the catalog
        interrupts what still runs on it and waits for the block to end."""
        assert isinstance(self.database, DuckDBDatabase), "a PostgreSQL catalog has none"
        with self.database.own_cursor() as raw:
            yield raw

    def query(self, statement: str | SQL, params: Mapping[str, Any] | None = None
              ) -> list[Row]:
        """Rows of a named statement (`load_sql` name) or an SQL, with bound parameters."""
        return run(self, statement, params).rows

    def execute(self, statement: str | SQL,
                params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> None:
        stmt = load_sql(statement) if isinstance(statement, str) else statement
        with self.transaction() as conn:
            conn.execute(stmt, params if params is not None else {})


Connectable = Catalog | Connection


def run(cat: Connectable, statement: str | SQL, params: Mapping[str, Any] | None = None
        ) -> Result:
    """A statement's result (a `load_sql` name or an SQL), on a connection or in a read
    transaction of its own."""
    stmt = load_sql(statement) if isinstance(statement, str) else statement
    if isinstance(cat, Catalog):
        with cat.reader() as conn:
            return conn.execute(stmt, dict(params or {}))
    return cat.execute(stmt, dict(params or {}))


def _open_duckdb(path: Path) -> DuckDBDatabase:
    try:
        return DuckDBDatabase(path)
    except duckdb.Error as e:
        first = first_line(e)
        if "lock" in first.lower():
            pid = re.search(r"PID (\d+)", str(e))
            holder = f"PID {pid.group(1)}" if pid else "lock held"
            raise CatalogInUse(
                f"catalog {path} is in use by another process "
                f"({holder}; a running `mergepipe serve` or merge?): "
                "DuckDB lets one process open it; use that process's API, or wait for it "
                "to end") from None
        ro = read_only_error(path, e)
        if ro is not None:
            raise ro from None
        raise CatalogUnreadable(f"cannot open the catalog {path}: {first}") from None


def _unreachable(e: Exception) -> bool:
    from mergepipe.catalog.postgres_database import unreachable  # only PostgreSQL's

    return unreachable(e)


def outage(e: BaseException) -> CatalogUnavailable | None:
    """The CatalogUnavailable an error of the catalog's database means, if it means one (an
    error raised past the catalog's own translation: a reader role's session, a pool)."""
    if isinstance(e, CatalogUnavailable):
        return e
    if not type(e).__module__.startswith(("sqlalchemy", "psycopg")):
        return None  # (DuckDB catalogs never load SQLAlchemy for this)
    from mergepipe.catalog.postgres_database import unavailable

    return unavailable(e) if isinstance(e, Exception) else None
