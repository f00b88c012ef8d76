"""The SQL sandbox's snapshot folder of a server killed with SIGKILL is removed when the next
server starts; a live server's folder (its lock held) is never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from mergepipe.sandbox.sql_snapshot import LOCK_FILE, PREFIX, _hold_lock, remove_stale
from tests.live_server import Api, start_server


def _serve(tmp_path: Path, tmp: Path, log: str) -> tuple[subprocess.Popen[bytes], Api]:
    return start_server(tmp_path, {"MERGEPIPE_CATALOG": str(tmp_path / "c.duckdb"),
                                   "TMPDIR": str(tmp)}, log=log, up_s=60)


def _snapshot_dirs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(PREFIX + "*"))


def test_a_killed_servers_snapshot_is_removed_at_the_next_start(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    first, api = _serve(tmp_path, tmp, "first.log")
    try:
        assert api.ok("POST", "/v1/sql", {"sql": "SELECT count(*) AS n FROM models"})
        (left,) = _snapshot_dirs(tmp)
        assert (left / LOCK_FILE).exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert _snapshot_dirs(tmp) == [left]  # SIGKILL: nothing cleaned up
    second, api = _serve(tmp_path, tmp, "second.log")
    try:
        assert _snapshot_dirs(tmp) == []  # removed at start, before any query
        api.ok("POST", "/v1/sql", {"sql": "SELECT 1 AS one"})
        (mine,) = _snapshot_dirs(tmp)
        assert remove_stale(tmp) == [] and _snapshot_dirs(tmp) == [mine]  # live: kept
    finally:
        second.terminate()
        second.wait(30)


def test_only_unlocked_folders_of_this_user_are_stale(tmp_path: Path) -> None:
    live, dead, young = (tmp_path / f"{PREFIX}{n}" for n in ("live", "dead", "young"))
    for d in (live, dead, young):
        d.mkdir()
    fd = _hold_lock(live)
    try:
        (dead / LOCK_FILE).write_text("")
        (dead / "snapshot.duckdb").write_bytes(b"x" * 100)
        (tmp_path / "mergepipe-other").mkdir()
        assert remove_stale(tmp_path) == [dead]  # `young` has no lock file yet: a start-up
        old = time.time() - 3600
        os.utime(young, (old, old))
        assert remove_stale(tmp_path) == [young]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mergepipe-other", live.name]
    finally:
        os.close(fd)
    assert remove_stale(tmp_path) == [live]  # its owner let go
