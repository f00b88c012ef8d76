"""A read-only copy of the catalog's tables, the database user SQL runs on (in this process and
in the SQL workers), in a private temporary folder that a dead server's successor removes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import duckdb

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.duckdb_database import DuckDBDatabase
from mergepipe.catalog.duckdb_module import duckdb as engine
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import SELECT_TABLES, sandbox_config


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _stamp(path: Path) -> tuple[int, ...]:
    """What changes when the catalog does: mtime and size of the file and its write-ahead log
    (every commit appends to the log; a checkpoint rewrites the file)."""
    out: list[int] = []
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            st = p.stat()
            out += [st.st_mtime_ns, st.st_size, st.st_ino]
        except FileNotFoundError:
            out += [0, 0, 0]
    return tuple(out)


PREFIX = "mergepipe-sql-"
# A server keeps its folder's lock file locked (flock) while it lives: a folder whose lock
# nobody holds was left by a server that died (SIGKILL, a crash).
LOCK_FILE = "owner.lock"
UNLOCKED_GRACE_S = 60.0  # a folder without a lock file yet may be a server's that is starting


def _hold_lock(d: Path) -> int:
    """Create and lock `d`'s lock file; the fd (kept open: the lock lasts as long as it)."""
    fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _is_stale(d: Path) -> bool:
    """Whether `d` is a dead server's folder: its lock file is not locked (or, with none, the
    folder is older than a start-up takes)."""
    try:
        fd = os.open(d / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return time.time() - d.lstat().st_mtime > UNLOCKED_GRACE_S
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False  # a live server holds it
    finally:
        os.close(fd)


def remove_stale(tmp: Path | None = None) -> list[Path]:
    """Delete the snapshot folders of dead servers of this user under the temporary directory
    (a server's start); the folders removed."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    for d in sorted(root.glob(PREFIX + "*")):
        try:
            st = d.lstat()
            if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
                    or not _is_stale(d)):
                continue
        except OSError:
            continue  # gone meanwhile, or not ours to look into
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _cleanup(d: Path, fd: int) -> None:
    shutil.rmtree(d, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(fd)


class SqlSnapshot:
    """The catalog's tables and views (their rows, as tables) in a DuckDB file of its own, in a
    private temporary folder: written under a temporary name, then renamed into place, again
    whenever the catalog has changed since. Nothing else (settings, paths) is in it."""

    def __init__(self, cat: Catalog) -> None:
        assert cat.path is not None, "PostgreSQL catalogs run user SQL in their reader role"
        self.cat = cat
        remove_stale()
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX))
        self._lock_fd = _hold_lock(self.dir)
        self.version = 0
        self.path = self._file(0)
        self._stamp: tuple[int, ...] | None = None
        self._begun = -1.0  # time.monotonic() when the current copy's catalog state was read
        self._lock = threading.Lock()
        self._open: tuple[object, DuckDBDatabase] | None = None  # (version, config), database
        self._open_lock = threading.Lock()
        weakref.finalize(self, _cleanup, self.dir, self._lock_fd)

    @contextlib.contextmanager
    def connect(self, limits: SqlLimits) -> Iterator[engine.DuckDBPyConnection]:
        """A connection of its own to the current copy, opened read-only with
        sandbox_config(limits); the database stays open for the next query until the copy or
        the limits change (then it closes once its last query has ended)."""
        path, version = self.current()
        config = sandbox_config(limits)
        with contextlib.ExitStack() as stack:
            with self._open_lock:
                if self._open is None or self._open[0] != (version, config):
                    if self._open is not None:
                        self._open[1].close_when_idle()
                        self._open = None
                    try:
                        self._open = ((version, config),
                                      DuckDBDatabase(path, read_only=True, config=config))
                    except engine.Error as e:  # other limits while a query with the old runs
                        raise InvalidRequest(f"query failed: {str(e).strip().splitlines()[0]}",
                                             field="sql") from None
                raw = stack.enter_context(self._open[1].own_cursor())
            yield raw

    def current(self) -> tuple[Path, int]:
        """(path, version) of a copy no older than the catalog at the time of the call: the
        last copy if the catalog has not changed since, or one begun after the call (callers
        waiting together share one copy)."""
        assert self.cat.path is not None
        arrived = time.monotonic()
        with self._lock:
            if self._begun < arrived:
                begun, stamp = time.monotonic(), _stamp(self.cat.path)
                if stamp != self._stamp:
                    self._write()
                    self._stamp = stamp
                    self.version += 1
                    self.path = self._file(self.version)
                    # the copy before stays for callers that are just opening it
                    self._file(self.version - 2).unlink(missing_ok=True)
                self._begun = begun
            return self.path, self.version

    def _file(self, version: int) -> Path:
        """Each copy has a name of its own: DuckDB shares one open database per path in a
        process, so a query still running on an older copy never makes a new query see it."""
        return self.dir / f"snapshot-{version}.duckdb"

    def _write(self) -> None:
        """Copy every table and view, in one read transaction of the catalog, into a new file
        (a DuckDB database of its own: the catalog's runs without file access, so it cannot
        ATTACH or COPY TO one), then rename it into place."""
        tmp = self.dir / f"next-{self.version + 1}.duckdb"
        tmp.unlink(missing_ok=True)
        # The reader's connection stays open until the copy ends: DuckDB closes a duplicate
        # with its parent.
        with self.cat.duckdb_reader() as raw:
            src: duckdb.DuckDBPyConnection = raw.duplicate()  # for one consistent read
            dst = duckdb.connect(str(tmp), config={"threads": 1, "memory_limit": "256MiB"})
            try:
                src.execute("BEGIN TRANSACTION READ ONLY")
                dst.execute("BEGIN TRANSACTION")  # one commit for all tables (0.1 s less)
                for (name,) in src.execute(SELECT_TABLES).fetchall():
                    _copy_table(src, dst, str(name))
                dst.execute("COMMIT")
            finally:
                dst.close()
                src.close()
        os.replace(tmp, self._file(self.version + 1))


class _Stream:
    """A query's rows as an Arrow C stream (the PyCapsule interface; no pyarrow needed), which
    the other database reads by its Python name."""

    def __init__(self, rel: duckdb.DuckDBPyRelation) -> None:
        self.rel = rel

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.rel.__arrow_c_stream__(requested_schema)


def _copy_table(src: duckdb.DuckDBPyConnection, dst: duckdb.DuckDBPyConnection,
                name: str) -> None:
    """One table's (or view's) columns, with their types, and rows."""
    cols = [(str(r[0]), str(r[1])) for r in src.execute(f"DESCRIBE main.{_quote(name)}").fetchall()]
    dst.execute(f"CREATE TABLE {_quote(name)} ("
                + ", ".join(f"{_quote(c)} {t}" for c, t in cols) + ")")
    rows = _Stream(src.sql(f"SELECT * FROM main.{_quote(name)}"))  # noqa: F841 - read by name
    dst.execute(f"INSERT INTO {_quote(name)} SELECT * FROM rows")


_snapshots: weakref.WeakKeyDictionary[Catalog, SqlSnapshot] = weakref.WeakKeyDictionary()
_snapshots_lock = threading.Lock()


def snapshot_for(cat: Catalog) -> SqlSnapshot:
    """The one snapshot of this catalog in this process."""
    with _snapshots_lock:
        snap = _snapshots.get(cat)
        if snap is None:
            snap = _snapshots[cat] = SqlSnapshot(cat)
        return snap
