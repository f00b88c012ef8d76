"""A real PostgreSQL server for the tests, from the machine's binaries, on a loopback port.

initdb into a temporary folder (as `nobody` when run as root: PostgreSQL refuses root),
durability off (the catalog is thrown away), a free 127.0.0.1 port.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def postgres_server() -> Iterator[str]:
    """A server for the test session, with room for the suite's connections; yields the
    superuser's URL (database `postgres`). Stopped and removed afterwards."""
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin "
                           "(apt-get install postgresql; .ci/run does it)")
    root = Path(tempfile.mkdtemp(prefix="mergepipe-test-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                                    "-U", SUPERUSER, "-E", "UTF8", "--no-sync", "--locale=C"]),
                   check=True, capture_output=True)
    port = _free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB")
    subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l",
                                    str(root / "log"), "-o", opts, "-w", "-t", "60", "start"]),
                   check=True, capture_output=True)
    try:
        yield f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m",
                                        "immediate", "-w", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def create_database(admin_url: str, name: str) -> str:
    """A fresh empty database on the server of `admin_url`; its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


class StoppableServer:
    """A server of its own for one test, which the test stops (an outage: its sessions end at
    once, its data is kept) and starts again on the same port."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.url = f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(self.root / "data"),
                                        *args]), check=True, capture_output=True)

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c max_connections=40")
        self._pg_ctl("-l", str(self.root / "log"), "-o", opts, "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "stop")


@contextmanager
def stoppable_server() -> Iterator[StoppableServer]:
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    root = Path(tempfile.mkdtemp(prefix="mergepipe-test-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
    subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(root / "data"), "-A",
                                    "trust", "-U", SUPERUSER, "-E", "UTF8", "--no-sync",
                                    "--locale=C"]), check=True, capture_output=True)
    server = StoppableServer(root, _free_port())
    server.start()
    try:
        yield server
    finally:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(root / "data"), "-m",
                                        "immediate", "-w", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
