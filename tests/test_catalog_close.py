"""Closing a DuckDB catalog, or ending the process, while a user query still runs on one of its
connections (a query past its time limit keeps running in its slot's thread until DuckDB's
interrupt stops it): the close waits for it instead of failing with DuckDB's
ResourceInUseException, and the process ends cleanly."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.user_sql import run_readonly

pytestmark = pytest.mark.duckdb_only("DuckDB's connections")

# About 0.7 s of work that DuckDB's interrupt cannot stop until it is computed.
DEAF = "SELECT length(regexp_replace(repeat('a', 20000000), 'a', 'bb', 'g'))"
# An interruptible query that would run for minutes.
LONG = "SELECT count(*) FROM range(1000000) a, range(1000000) b"


def timed_out(cat: Catalog, sql: str) -> None:
    with pytest.raises(InvalidRequest, match="time limit"):
        run_readonly(cat, sql, SqlLimits(timeout_s=0.1, slots=4))


def sql_threads() -> int:
    return sum(t.name == "mergepipe-sql" for t in threading.enumerate())


def test_close_while_timed_out_queries_still_run(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "c.duckdb")
    before = sql_threads()
    started = [threading.Thread(target=timed_out, args=(cat, DEAF)) for _ in range(3)]
    for t in started:
        t.start()
    for t in started:
        t.join()  # each caller had its time-limit error; their queries go on
    assert sql_threads() > before
    cat.close()  # used to raise ResourceInUseException: connection is busy with another call
    # the slots' threads end their queries and release their connections (close waits up to
    # CLOSE_WAIT_S for them; on a loaded machine the last release may close the file)
    deadline = time.monotonic() + 120
    while sql_threads() > before:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # the file is free again: another catalog opens it and reads it
    with Catalog(tmp_path / "c.duckdb") as again:
        assert run_readonly(again, "SELECT 1")["rows"] == [[1]]


def test_a_catalog_closed_twice_and_used_after_closing(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "c.duckdb")
    cat.close()
    cat.close()
    with pytest.raises(Exception, match="closed"):
        cat.query(SQL("SELECT 1"))


EXIT = """
import sys, time
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.user_sql import run_readonly

cat = Catalog(sys.argv[1])
for _ in range(3):
    try:
        run_readonly(cat, sys.argv[2], SqlLimits(timeout_s=0.1, slots=4))
    except InvalidRequest:
        pass
if sys.argv[3] == "close":
    cat.close()
print("done", flush=True)
"""


@pytest.mark.parametrize("how", ["close", "exit"])
@pytest.mark.parametrize("sql", [DEAF, LONG], ids=["deaf", "interruptible"])
def test_the_process_ends_cleanly_while_queries_run(tmp_path: Path, sql: str, how: str) -> None:
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", EXIT, str(tmp_path / "c.duckdb"), sql, how],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n" and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("sql", ["DROP TABLE models", "SELECT nope FROM models"])
def test_a_refused_query_ends_the_command_at_once(tmp_path: Path, sql: str) -> None:
    """A CLI query that fails (refused, or DuckDB's binder error) exits with its one line right
    away: the failed call's connection, kept alive only by the error's traceback, is freed at
    exit instead of being waited for until the close deadline (30 s)."""
    db = tmp_path / "c.duckdb"
    Catalog(db).close()
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", str(db), "sql", sql],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert time.monotonic() - start < 15, "the exit waited for the close deadline"
