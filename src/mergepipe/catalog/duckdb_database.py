"""A DuckDB catalog file through DuckDB's own Python API (0.02 s to open; SQLAlchemy took 0.4 s).

Every connection handed out is tracked: DuckDB refuses to close a connection busy with a call,
and aborts the process if a thread is still inside it when the interpreter ends. `dispose()`
interrupts them and waits (the last release closes the database if the wait runs out), and at
exit every open database is disposed before the interpreter tears its threads down."""

from __future__ import annotations

import atexit
import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from mergepipe.catalog.connection import SQL, DriverConnection, Params, Result
from mergepipe.catalog.duckdb_module import duckdb
from mergepipe.core.errors import CatalogReadOnly

log = logging.getLogger("mergepipe.catalog")

# How long dispose() waits for calls still running on the database's connections (interrupted),
# and how often it interrupts them again meanwhile.
CLOSE_WAIT_S = 30.0
INTERRUPT_EVERY_S = 0.1


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


# DuckDB's settings at connect, as its Python API types them.
Config = dict[str, str | bool | int | float | list[str]]


class DuckDBConnection(DriverConnection):
    """One DuckDB connection to the catalog, in one transaction."""

    integrity_error = duckdb.IntegrityError

    def __init__(self, raw: duckdb.DuckDBPyConnection) -> None:
        self.raw = raw

    def _run(self, statement: SQL, sets: Params | list[Params]) -> Result:
        if isinstance(sets, list):
            self.raw.executemany(statement.numbered, [statement.values(p) for p in sets])
        else:
            self.raw.execute(statement.numbered, statement.values(sets))
        description = self.raw.description
        if not description:
            return Result([], [], self.raw.rowcount)
        return Result([d[0] for d in description], self.raw.fetchall(), self.raw.rowcount)


class DuckDBDatabase:
    """The catalog file (or the SQL sandbox's read-only snapshot of it, with the sandbox's
    config), opened once; each transaction gets a connection of its own."""

    def __init__(self, path: Path, read_only: bool = False, config: Config | None = None
                 ) -> None:
        self.path = path
        # No file or network access from SQL: the catalog's SQL reads only the catalog.
        default: Config = {"enable_external_access": False}
        self.db = duckdb.connect(str(path), read_only=read_only, config=config or default)
        self._lock = threading.Lock()  # DuckDB's parent connection is not for threads
        self._released = threading.Condition(self._lock)
        self._open: set[duckdb.DuckDBPyConnection] = set()  # handed out, interruptible
        self._held = 0  # handed out and not yet closed
        # handed out and not yet freed: a connection object's destructor releases the GIL, and
        # a thread that frees one while the interpreter ends is unwound inside DuckDB
        self._objects: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        self._closing = False
        self._closed = False
        _LIVE.add(self)

    @contextmanager
    def own_cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A new connection to the database, closed when the block ends (rolling back what it
        began); the last one closed after dispose() gave up waiting closes the database."""
        with self._lock:
            if self._closing:
                raise duckdb.ConnectionException("the catalog is closed")
            raw = self.db.cursor()
            self._open.add(raw)
            self._held += 1
            self._objects.add(raw)
        try:
            yield raw
        finally:
            with self._lock:
                self._open.discard(raw)  # never interrupted while it closes
            try:
                raw.close()
            finally:
                with self._lock:
                    self._held -= 1
                    self._released.notify_all()
                    if self._closing and not self._held and not self._closed:
                        self._closed = True
                        self.db.close()

    @contextmanager
    def begin(self) -> Iterator[DuckDBConnection]:
        """A write transaction: committed when the block ends, rolled back if it raises;
        CatalogReadOnly if the file cannot be written."""
        with self._writable(), self.own_cursor() as raw:
            raw.begin()
            try:
                yield DuckDBConnection(raw)
            except BaseException:
                # (a fatal error may have ended the transaction already: report that one)
                with suppress(duckdb.Error):
                    raw.rollback()
                raise
            raw.commit()

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
        with self._writable(), self.own_cursor() as raw:  # its release rolls back
            raw.begin()
            yield DuckDBConnection(raw)

    def close_when_idle(self) -> None:
        """Close the database now if no connection is handed out, else when the last one is
        released (nothing interrupted: the calls run to their end)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if not self._held:
                self._closed = True
                self.db.close()

    def dispose(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Close the database: interrupt the calls still running on its connections and wait
        up to `wait_s` for their holders to release them; past that, the last release closes
        it."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            deadline = time.monotonic() + wait_s
            while self._held:
                # again and again: DuckDB forgets an interrupt that comes before a statement
                # starts (a holder between two statements, or still preparing its query)
                for raw in self._open:
                    with suppress(duckdb.Error):
                        raw.interrupt()
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("catalog closing with %d call(s) still running after %.0fs: "
                                "it closes when they end", self._held, wait_s)
                    return
                self._released.wait(min(INTERRUPT_EVERY_S, left))
            self._closed = True
            self.db.close()


_LIVE: weakref.WeakSet[DuckDBDatabase] = weakref.WeakSet()


@atexit.register
def _dispose_all() -> None:
    """At exit, no thread may still be inside DuckDB (see the module's docstring): every open
    database is closed, and the connection objects its holders still reference are freed
    (their threads drop them once their calls returned) before the interpreter ends."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    for database in list(_LIVE):
        database.dispose(max(0.0, deadline - time.monotonic()))
        while database._objects and time.monotonic() < deadline:
            gc.collect()  # one kept only by a reference cycle (a caught error's traceback)
            if database._objects:
                time.sleep(0.01)
