"""Run `python -m mergepipe` as a real process and SIGKILL it at observed points or delays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog

# Rows an ingestion writes, per table (all or nothing).
MODEL_TABLES = {"models": "name", "files": "model", "tensors": "model", "blocks": "model",
                "block_stats": "model", "tensor_stats": "model"}


class Cli:
    """`python -m mergepipe --catalog DB ...` in a child process with a clean environment."""

    def __init__(self, db: Path | str, cwd: Path) -> None:
        self.db = db
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MERGEPIPE_")}
        self.env["OMP_NUM_THREADS"] = "1"

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mergepipe", "--catalog", str(self.db), *args]

    def run(self, *args: str, timeout: float = 300) -> dict[str, Any]:
        p = subprocess.run(self.argv(*args, "--json"), cwd=self.cwd, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, (args, p.stderr[-2000:])
        out: dict[str, Any] = json.loads(p.stdout)
        return out

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(*args, "--json"), cwd=self.cwd, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def alive(pid: int) -> bool:
    """Whether a process is running (a zombie is dead too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def has_open(pid: int, needle: str) -> bool:
    """True if process `pid` holds a file descriptor on a path containing `needle`."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if needle in os.readlink(f"/proc/{pid}/fd/{fd}"):
                return True
        except OSError:
            continue
    return False


def kill_when(proc: subprocess.Popen[bytes], trigger: Callable[[], bool], delay: float = 0.0,
              timeout: float = 300) -> bool:
    """SIGKILL `proc` `delay` seconds after `trigger()` first holds. False if it ended first
    (then it must have succeeded)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if trigger():
            if delay:
                time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            break
        assert time.monotonic() < deadline, "trigger never held"
        time.sleep(0.001)
    rc = proc.wait(60)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if rc == -signal.SIGKILL:
        return True
    assert rc == 0, stderr[-2000:]
    return False


def timed(proc: subprocess.Popen[bytes], trigger: Callable[[], bool]) -> float:
    """Seconds from `trigger()` first holding to the process's (successful) end."""
    t0 = None
    while proc.poll() is None:
        if t0 is None and trigger():
            t0 = time.monotonic()
        time.sleep(0.001)
    assert proc.wait() == 0, proc.stderr.read().decode() if proc.stderr else ""
    return time.monotonic() - (t0 if t0 is not None else time.monotonic())


def model_rows(db: Path | str, name: str) -> dict[str, int]:
    """Rows of model `name` per ingestion table (opening the catalog replays its WAL)."""
    with Catalog(db) as cat:
        return {t: int(cat.query(SQL(f"SELECT count(*) FROM {t} WHERE {col} = :n"),
                                 {"n": name})[0][0])
                for t, col in MODEL_TABLES.items()}


def block_fingerprint(db: Path | str, name: str) -> list[tuple[Any, ...]]:
    """What ingestion computed for a model, without its name: blocks, hashes and statistics."""
    with Catalog(db) as cat:
        rows = cat.query(SQL(
            "SELECT b.tensor, b.block_index, b.byte_offset, b.nbytes, b.content_hash, "
            "s.l2, s.l1, s.max_abs, s.nnz FROM blocks b LEFT JOIN block_stats s "
            "ON s.model = b.model AND s.tensor = b.tensor AND s.block_index = b.block_index "
            "WHERE b.model = :n ORDER BY b.tensor, b.block_index"), {"n": name})
        return [tuple(r) for r in rows]


def merge_rows(db: Path) -> dict[str, dict[str, Any]]:
    """merge_id -> {status, error, output_name, output_path} of every merge."""
    with Catalog(db) as cat:
        rows = cat.query(SQL("SELECT merge_id, status, error, output_name, output_path "
                                 "FROM merges"))
        return {str(r.merge_id): dict(r._mapping) for r in rows}
