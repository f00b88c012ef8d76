"""A throw-away PostgreSQL server from the machine's binaries, on loopback, for the benchmarks
and the tests (tests/pg_server.py starts theirs with it).

initdb into a temporary folder (as `nobody` when run as root: PostgreSQL refuses root),
durability off (the catalog is thrown away), a free 127.0.0.1 port.
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


def pg_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/N/bin holding initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


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
def local_postgres(max_connections: int = 100, *options: str) -> Iterator[LocalPostgres]:
    """A started server (its URL, its data folder) with more `-c name=value` options;
    stopped and removed afterwards."""
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin "
                           "(apt-get install postgresql; .ci/run does it)")
    root = Path(tempfile.mkdtemp(prefix="mergepipe-bench-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                                    "-U", SUPERUSER, "-E", "UTF8", "--no-sync", "--locale=C"]),
                   check=True, capture_output=True)
    port = _free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off "
            f"-c synchronous_commit=off -c full_page_writes=off -c max_connections={max_connections}"
            + "".join(f" -c {o}" for o in options))
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l",
                                    str(root / "log"), "-o", opts, "-w", "-t", "60", "start"]),
                   check=True, capture_output=True)
    try:
        yield LocalPostgres(f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres", data)
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m",
                                        "immediate", "-w", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
