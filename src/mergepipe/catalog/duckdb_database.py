"""A DuckDB catalog file through DuckDB's own Python API (what a command opens in 0.02 s; the
SQLAlchemy engine and its DuckDB dialect took 0.4 s to import and connect)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from mergepipe.catalog.connection import SQL, IntegrityError, Params, Result, parameter_sets
from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import CatalogReadOnly

# What the operating system says when a file cannot be written whatever we do: an immutable
# file or folder (chattr +i), a read-only mount, no write permission.
READ_ONLY_SIGNS = ("Operation not permitted", "Read-only file system", "Permission denied")


def read_only_error(path: Path, e: BaseException) -> CatalogReadOnly | None:
    """CatalogReadOnly (503, with what to do) if `e` says the catalog cannot be written."""
    text = str(e)
    why = next((s for s in READ_ONLY_SIGNS if s in text), None)
    if why is None:
        return None
    restart = (" and restart the server (DuckDB stops using a catalog after a failed write "
               "to its file)" if "invalidated" in text else "")
    return CatalogReadOnly(
        f"the catalog {path} cannot be written ({why}): its file or its folder is read-only "
        f"or immutable (a read-only mount, chattr +i, no write permission). Make it writable (chattr -i, remount read-write, fix the owner){restart}")


class DuckDBConnection:
    """One DuckDB connection to the catalog, in one transaction."""

    def __init__(self, raw: duckdb.DuckDBPyConnection) -> None:
        self.raw = raw

    def execute(self, statement: SQL, params: Params | Sequence[Params] | None = None
                ) -> Result:
        sets = parameter_sets(params)
        if sets == []:
            return Result([], [], 0)
        try:
            if isinstance(sets, list):
                self.raw.executemany(statement.numbered, [statement.values(p) for p in sets])
            else:
                self.raw.execute(statement.numbered, statement.values(sets))
        except duckdb.IntegrityError as e:
            raise IntegrityError(str(e)) from e
        description = self.raw.description
        if not description:
            return Result([], [], self.raw.rowcount)
        return Result([d[0] for d in description], self.raw.fetchall(), self.raw.rowcount)


class DuckDBDatabase:
    """The catalog file, opened once; each transaction gets a connection of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # No file or network access from SQL: the catalog's SQL reads only the catalog.
        self.db = duckdb.connect(str(path), config={"enable_external_access": False})
        self._lock = threading.Lock()  # DuckDB's parent connection is not for threads

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the database (it closes with the database at the latest)."""
        with self._lock:
            return self.db.cursor()

    @contextmanager
    def begin(self) -> Iterator[DuckDBConnection]:
        """A write transaction: committed when the block ends, rolled back if it raises;
        CatalogReadOnly if the file cannot be written."""
        with self._writable():
            raw = self.cursor()
            try:
                raw.begin()
                try:
                    yield DuckDBConnection(raw)
                except BaseException:
                    # (a fatal error may have ended the transaction already: report that one)
                    with suppress(duckdb.Error):
                        raw.rollback()
                    raise
                raw.commit()
            finally:
                raw.close()

    @contextmanager
    def _writable(self) -> Iterator[None]:
        try:
            yield
        except duckdb.Error as e:
            err = read_only_error(self.path, e)
            if err is None:
                raise
            raise err from None

    @contextmanager
    def connect(self) -> Iterator[DuckDBConnection]:
        """A read transaction: one consistent view of the catalog, nothing written (a
        catalog invalidated by a failed write: CatalogReadOnly too)."""
        with self._writable():
            raw = self.cursor()
            try:
                raw.begin()
                yield DuckDBConnection(raw)
            finally:
                raw.close()  # rolls back whatever was begun

    def dispose(self) -> None:
        self.db.close()
