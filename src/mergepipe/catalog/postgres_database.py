"""A PostgreSQL catalog through SQLAlchemy and psycopg 3, with dialect.py's rewrites applied to
every statement and results read back as DuckDB returns them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import sqlalchemy as sa

from mergepipe.catalog.connection import (
    SQL,
    CatalogUnavailable,
    DriverConnection,
    Params,
    Result,
    first_line,
)
from mergepipe.catalog.dialect import engine_url, to_postgres, unnest_rows
from mergepipe.core.errors import CatalogReadOnly, InvalidRequest

READ_ONLY_SQLSTATE = "25006"  # read_only_sql_transaction


@cache
def _text(statement: SQL) -> sa.TextClause:
    return sa.text(statement.text)


class PostgresConnection(DriverConnection):
    """One pooled connection, in one transaction."""

    integrity_error = sa.exc.IntegrityError

    def __init__(self, conn: sa.Connection) -> None:
        self.sa = conn

    def _run(self, statement: SQL, sets: Params | list[Params]) -> Result:
        res = self.sa.execute(_text(statement), sets)
        if not res.returns_rows:
            return Result([], [], res.rowcount)
        return Result(list(res.keys()), [tuple(r) for r in res], res.rowcount)


class PostgresDatabase:
    """A pool of connections to the catalog database, in UTC."""

    def __init__(self, location: str, **pool: Any) -> None:
        try:
            import psycopg  # noqa: F401 - the optional `cluster` extra
        except ImportError:
            raise InvalidRequest("a PostgreSQL catalog needs psycopg 3: pip install "
                                 "'mergepipe[cluster]'", field="catalog") from None
        # UTF8 on the wire whatever the database's encoding (one created SQL_ASCII would give
        # bytes for text, which SQLAlchemy cannot even read the server's version from)
        self.engine = sa.create_engine(
            engine_url(location), pool_pre_ping=True,
            connect_args={"options": "-c timezone=UTC -c client_encoding=UTF8"}, **pool)
        sa.event.listen(self.engine, "connect", _register_loaders)
        sa.event.listen(self.engine, "before_cursor_execute", _rewrite, retval=True)

    @contextmanager
    def begin(self) -> Iterator[PostgresConnection]:
        try:
            with _outages(), self.engine.begin() as conn:
                yield PostgresConnection(conn)
        except sa.exc.DBAPIError as e:
            if getattr(e.orig, "sqlstate", None) != READ_ONLY_SQLSTATE:
                raise
            raise CatalogReadOnly(
                "the PostgreSQL catalog is read-only (a hot standby, or "
                "default_transaction_read_only on the database or role): point "
                "MERGEPIPE_CATALOG at the primary, or make the database writable") from None

    @contextmanager
    def connect(self) -> Iterator[PostgresConnection]:
        with _outages(), self.engine.connect() as conn:
            yield PostgresConnection(conn)

    def dispose(self) -> None:
        self.engine.dispose()


def unreachable(e: Exception) -> bool:
    """Whether an error of the catalog says the server cannot be used (down, refused login)."""
    return isinstance(e, sa.exc.OperationalError)


# SQLSTATE classes (and codes) of a server that cannot be used: connection exceptions, refused
# authorization, no such database, out of resources; shut down, crashed, still starting.
_OUTAGE_CLASSES = ("08", "28", "3D", "53")
_OUTAGE_CODES = ("57P01", "57P02", "57P03")


def unavailable(e: Exception) -> CatalogUnavailable | None:
    """The outage a database error means, or None for any other error (a query cancelled by
    its statement timeout, a serialization failure, a broken constraint)."""
    import psycopg

    orig = getattr(e, "orig", e)
    lost = isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated
    if not lost and isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        state = getattr(orig, "sqlstate", None)
        lost = state is None or state[:2] in _OUTAGE_CLASSES or state in _OUTAGE_CODES
    if not lost:
        return None
    return CatalogUnavailable(f"the PostgreSQL catalog cannot be reached ({first_line(orig)}); "
                              "retry shortly")


@contextmanager
def _outages() -> Iterator[None]:
    """The database's errors that mean an outage, as CatalogUnavailable."""
    try:
        yield
    except sa.exc.DBAPIError as e:
        down = unavailable(e)
        if down is None:
            raise
        raise down from e


def _rewrite(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
             executemany: bool) -> tuple[str, Any]:
    bulk = None if executemany else unnest_rows(statement, parameters)
    if bulk is not None:
        cursor.executemany(*bulk)
        return "SELECT 1 WHERE false", {}
    before, statement = to_postgres(statement)
    for first in before:
        cursor.execute(first)
    return statement, parameters


def _register_loaders(dbapi_conn: Any, _record: Any) -> None:
    """Read results as DuckDB gives them: NUMERIC (sums of BIGINT) as int when whole (float
    otherwise)."""
    from psycopg.adapt import Loader

    class WholeNumericLoader(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode()
            return int(text) if text.lstrip("-").isdigit() else float(text)

    adapters = dbapi_conn.adapters
    adapters.register_loader("numeric", WholeNumericLoader)
