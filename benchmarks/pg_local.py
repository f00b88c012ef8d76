"""A throw-away PostgreSQL server for the benchmarks, from the machine's binaries, on loopback.

The tests start theirs with tests/pg_server.py (benchmarks do not import tests); this is the
same recipe: initdb into a temporary folder (as `nobody` when run as root: PostgreSQL refuses
root), durability off (a benchmark's catalog is thrown away), a free 127.0.0.1 port.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

SUPERUSER = "mergepipe"


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise SystemExit("no PostgreSQL binaries under /usr/lib/postgresql/*/bin "
                         "(apt-get install postgresql)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "nobody", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass(frozen=True)
class LocalPostgres:
    url: str  # SQLAlchemy URL of the `postgres` database, as the superuser
    data: Path

    def cpu_seconds(self) -> float:
        """CPU seconds of the server's live processes (the postmaster and its backends)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        total = 0.0
        main = psutil.Process(pid)
        for proc in [main, *main.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
        return total


@contextmanager
def local_postgres() -> Iterator[LocalPostgres]:
    """A started server (its URL, its data folder); stopped and removed afterwards."""
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="mergepipe-bench-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                                    "-U", SUPERUSER, "-E", "UTF8", "--no-sync", "--locale=C"]),
                   check=True, capture_output=True)
    port = _free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l",
                                    str(root / "log"), "-o", opts, "-w", "-t", "60", "start"]),
                   check=True, capture_output=True)
    try:
        yield LocalPostgres(f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres", data)
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m",
                                        "immediate", "-w", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
