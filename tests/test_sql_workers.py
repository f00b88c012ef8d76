"""User SQL of the server in worker processes (sql_procs.py): a snapshot of the catalog's tables,
a data-size limit, a kill past the time limit, a dead worker replaced, a clear error each time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox import sql_procs
from mergepipe.sandbox.sql_snapshot import snapshot_for
from mergepipe.sandbox.user_sql import run_user_sql_async

pytestmark = pytest.mark.duckdb_only(
    "user SQL in DuckDB worker processes over a snapshot file, with rlimits")

LIMITS = SqlLimits(timeout_s=20)


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    with Catalog(tmp_path_factory.mktemp("workers") / "catalog.duckdb") as c:
        # the workers start at the first query (imports: about a second, more on a busy host)
        run(c, "SELECT 1", SqlLimits(timeout_s=120))
        yield c


def run(cat: Catalog, sql: str, limits: SqlLimits = LIMITS) -> dict[str, object]:
    # a loop of its own, on a thread of its own: an earlier test of the session may have left
    # a running event loop on this one (asyncio.run refuses to nest)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_user_sql_async(cat, sql, limits)).result()


def workers() -> list[psutil.Process]:
    """This process's live SQL worker processes."""
    out = []
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # one just killed (a zombie, or gone)
            if p.status() != psutil.STATUS_ZOMBIE \
                    and "mergepipe.sandbox.sql_worker" in " ".join(p.cmdline()):
                out.append(p)
    return out


def test_queries_run_in_worker_processes_over_a_fresh_snapshot(cat: Catalog) -> None:
    assert run(cat, "SELECT count(*) FROM lineage")["rows"] == [[0]]
    assert workers() and all(p.pid != os.getpid() for p in workers())
    cat.execute(SQL(
        "INSERT INTO lineage VALUES ('c', 'p', 'base', 0.5, 'm1')"))
    # the catalog changed: the next query sees the new row
    assert run(cat, "SELECT child, weight FROM lineage")["rows"] == [["c", 0.5]]
    snap = snapshot_for(cat)
    assert cat.path is not None and snap.path.is_file()
    assert not str(snap.path).startswith(str(cat.path.parent))  # a private folder of its own
    # the guard runs in the worker too, over the snapshot's tables
    with pytest.raises(InvalidRequest, match="not a catalog table"):
        run(cat, "SELECT * FROM duckdb_settings")
    with pytest.raises(InvalidRequest, match="not allowed"):
        run(cat, "SELECT current_setting('memory_limit')")


@pytest.mark.parametrize("sql", [
    "SELECT length(repeat('x', 2000000000))",
    "SELECT len(list(range(100000000)))",
])
def test_whole_allocation_bombs_hit_the_workers_memory_limit(cat: Catalog, sql: str) -> None:
    """In the server's process these grew it by gigabytes (DuckDB's memory_limit does not
    bound one huge scalar); a worker's RLIMIT_DATA refuses them at once."""
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match="(?i)out of memory.*MiB") as e:
        run(cat, sql)
    assert time.monotonic() - t0 < 10, e.value
    assert e.value.field == "sql"
    assert run(cat, "SELECT 42")["rows"] == [[42]]


def test_a_worker_past_its_time_limit_is_killed_and_replaced(cat: Catalog) -> None:
    """A regexp_replace over a 100 MB string ignores DuckDB's interrupt (8 s here): the worker
    is killed at the limit. (md5 of a huge string is interrupted once its argument is built,
    so on a fast machine it answered within the grace time and was never killed.)"""
    lim = SqlLimits(timeout_s=0.5)
    run(cat, "SELECT 1", lim)
    before = {p.pid for p in workers()}
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match="time limit"):
        run(cat, "SELECT length(regexp_replace(repeat('a', 100000000), 'a', 'bb', 'g'))", lim)
    assert time.monotonic() - t0 < lim.timeout_s + 1
    for _ in range(100):  # the slot's thread kills and replaces it (the caller may hear first)
        after = {p.pid for p in workers()}
        if len(after) == lim.slots and before - after:
            break
        time.sleep(0.05)
    assert len(after) == lim.slots and before - after, (before, after)
    # (the replacement imports DuckDB first: a generous limit on a busy host)
    assert run(cat, "SELECT 7", LIMITS)["rows"] == [[7]]


def test_a_worker_that_dies_gives_a_clear_error_and_is_replaced(cat: Catalog) -> None:
    run(cat, "SELECT 1")
    killed: list[int] = []

    def kill_busy() -> None:  # SIGKILL the worker running the slow query
        for _ in range(400):
            busy = list(sql_procs.POOL.busy)
            if busy:
                time.sleep(0.3)
                killed.append(busy[0].proc.pid)
                os.kill(busy[0].proc.pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    t = threading.Thread(target=kill_busy)
    t.start()
    with pytest.raises(InvalidRequest, match="SQL worker process ended \\(signal 9\\).*MiB"):
        run(cat, "SELECT count(*) FROM range(1000000) a, range(1000000) b")
    t.join()
    assert killed and killed[0] not in {p.pid for p in workers()}
    assert run(cat, "SELECT 8")["rows"] == [[8]]


def test_workers_get_none_of_the_servers_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERGEPIPE_API_TOKEN", "secret-token")
    env = sql_procs.worker_env()
    assert "MERGEPIPE_API_TOKEN" not in env and env["OMP_NUM_THREADS"] == "1"
    assert not any("TOKEN" in k or "URL" in k for k in env)


def test_the_data_limit_is_sized_from_the_limits() -> None:
    lim = SqlLimits()
    assert sql_procs.data_limit(lim) == sql_procs.BASE_DATA + lim.memory_bytes + \
        4 * lim.result_bytes
    assert sql_procs.data_limit(lim) < 1 << 30


def test_the_snapshot_is_written_whole_then_renamed(cat: Catalog, tmp_path: Path) -> None:
    snap = snapshot_for(cat)
    path, version = snap.current()
    assert snap.current() == (path, version)  # unchanged catalog: no new copy
    cat.execute(SQL(
        "INSERT INTO lineage VALUES ('c2', 'p', 'base', 1.0, 'm2')"))
    path2, version2 = snap.current()
    # each copy has a name of its own (a process shares one open database per path)
    assert version2 == version + 1 and path2 == path.with_name(f"snapshot-{version2}.duckdb")
    # no leftovers (owner.lock: the server's claim on the folder, sandbox.sql_snapshot); the
    # copy before stays for one more round, for callers just opening it
    assert sorted(p.name for p in snap.dir.iterdir()) == ["owner.lock", path.name, path2.name]
    cat.execute(SQL("INSERT INTO lineage VALUES ('c3', 'p', 'base', 1.0, 'm3')"))
    path3, _ = snap.current()
    assert sorted(p.name for p in snap.dir.iterdir()) == ["owner.lock", path2.name, path3.name]


def test_the_snapshot_copy_survives_other_connections_ending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB closes a duplicated connection with its parent: while the copy runs, other
    requests' transactions and readers open and end their connections (many concurrent
    requests), and the copy still reads every table through its own."""
    from mergepipe.sandbox import sql_snapshot

    copy_table = sql_snapshot._copy_table
    ended: list[int] = []

    def copy_while_others_come_and_go(src: Any, dst: Any, name: str) -> None:
        for _ in range(3):
            with c.transaction() as conn:
                conn.execute(SQL("SELECT count(*) FROM models"))
            ended.append(len(c.query(SQL("SELECT 1"))))
        copy_table(src, dst, name)

    with Catalog(tmp_path / "catalog.duckdb") as c:
        c.execute(SQL("INSERT INTO lineage VALUES ('c1', 'p', 'base', 1.0, 'm1')"))
        monkeypatch.setattr(sql_snapshot, "_copy_table", copy_while_others_come_and_go)
        path, _ = snapshot_for(c).current()
        monkeypatch.undo()
        assert ended  # the others ran during the copy
        with duckdb.connect(str(path), read_only=True) as snap:
            assert snap.execute("SELECT count(*) FROM lineage").fetchone() == (1,)


def test_a_workers_snapshot_connection_has_its_limits_locked(tmp_path: Path) -> None:
    """The engine limits are the connection's own settings, and no statement can change them
    (DuckDB's lock_configuration), whatever slipped past the guard."""
    from mergepipe.sandbox.sql_worker import Database

    path = tmp_path / "snap.duckdb"
    with duckdb.connect(str(path)) as raw:
        raw.execute("CREATE TABLE t AS SELECT 1 AS x")
    lim = SqlLimits(memory_bytes=96 << 20, threads=1, temp_bytes=64 << 20)
    conn = Database().open(str(path), 1, lim)
    got = conn.execute("SELECT current_setting('memory_limit'), current_setting('threads'), "
                       "current_setting('enable_external_access')").fetchone()
    assert got == ("96.0 MiB", 1, False)
    for stmt in ("SET memory_limit = '4GB'", "SET threads = 8", "RESET memory_limit",
                 "SET enable_external_access = true", "SET lock_configuration = false"):
        with pytest.raises(duckdb.Error, match="configuration"):
            conn.execute(stmt)
    assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
