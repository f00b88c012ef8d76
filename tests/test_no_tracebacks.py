"""Commands that used to end in a traceback now end in one line on stderr (or just work): a
second `serve` on a catalog in use, `bench` without mergekit, `fidelity` without transformers,
and `serve` / `worker` on a PostgreSQL database created with the SQL_ASCII encoding."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests import factory

REPO = Path(__file__).resolve().parent.parent

# A test-side device: a sitecustomize that hides the modules named in $HIDE_MODULES from this
# process and every Python process it starts (as if the package were not installed).
SITECUSTOMIZE = """
import importlib.abc, os, sys

HIDDEN = set(filter(None, os.environ.get("HIDE_MODULES", "").split(",")))


class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hide())
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERGEPIPE_")}
    env.setdefault("PYTHONPATH", str(REPO))
    env.update(extra)
    return env


def one_line_failure(proc: subprocess.CompletedProcess[str], command: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode != 0, (proc.stdout, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"mergepipe {command}: error: "), err
    return err


@pytest.mark.parametrize(("hidden", "argv", "named"), [
    ("mergekit", ["bench", "--quick", "--out", "OUT"], "'mergekit'"),
    ("transformers", ["fidelity", "--quick", "--dir", "OUT"], "'transformers'"),
])
def test_a_missing_optional_package_is_one_line(tmp_path: Path, hidden: str, argv: list[str],
                                                named: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = clean_env(HIDE_MODULES=hidden)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    check = subprocess.run([sys.executable, "-c", f"import {hidden}"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode != 0  # the device works: the package is hidden
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mergepipe",
                           *[str(out) if a == "OUT" else a for a in argv]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    err = one_line_failure(proc, argv[0])
    assert named in err and "pip install" in err, err
    assert time.monotonic() - t0 < 60  # refused before any work
    assert not out.exists() or not any(out.iterdir())


HOLD = """
import sys, time
from mergepipe.catalog.db import Catalog
cat = Catalog(sys.argv[1])
open(sys.argv[2], "w").close()
time.sleep(120)
"""


@pytest.mark.duckdb_only("DuckDB's one-process file lock")
def test_a_second_serve_on_a_catalog_in_use_is_one_line(tmp_path: Path) -> None:
    db, ready = tmp_path / "catalog.duckdb", tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(ready)], cwd=REPO,
                              env=clean_env())
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", str(db), "serve",
                               "--port", "0"], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        err = one_line_failure(proc, "serve")
        assert "in use by another process" in err and f"PID {holder.pid}" in err, err
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def sql_ascii_catalog() -> str:
    """A database created with ENCODING 'SQL_ASCII' on the session's PostgreSQL server."""
    import psycopg

    from tests.catalogs import admin_url

    admin = admin_url()
    name = f"ascii_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' TEMPLATE template0")
    return admin.rsplit("/", 1)[0] + f"/{name}"


def test_serve_and_worker_on_a_sql_ascii_database(tmp_path: Path,
                                                  sql_ascii_catalog: str) -> None:
    url = sql_ascii_catalog
    data = tmp_path / "modèle"  # a path that is not ASCII, stored and read back as text
    factory.make_base(data / "base", seed=0)
    env = clean_env(MERGEPIPE_CATALOG=url)
    worker = subprocess.Popen([sys.executable, "-m", "mergepipe", "worker", "--data-root",
                               str(tmp_path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stderr is not None
        line = worker.stdout.readline()
        assert line.startswith("worker ") and line.strip().endswith("ready"), (
            line, worker.stderr.read() if worker.poll() is not None else "")
        ingest = subprocess.run([sys.executable, "-m", "mergepipe", "ingest", str(data / "base"),
                                 "--name", "base"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert ingest.returncode == 0, ingest.stderr
        listed = subprocess.run([sys.executable, "-m", "mergepipe", "models", "--json"],
                                cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert [m["path"] for m in json.loads(listed.stdout)] == [str(data / "base")]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    port = factory_free_port()
    server = subprocess.Popen([sys.executable, "-m", "mergepipe", "serve", "--port", str(port),
                               "--data-root", str(tmp_path)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/base",
                                            timeout=10) as r:
                    assert json.loads(r.read())["path"] == str(data / "base")
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0


def factory_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
