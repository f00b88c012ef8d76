"""The CLI beside a running `mergepipe serve` on a DuckDB catalog: the server holds the file, the
commands go through its API (the advertisement next to the catalog) with the output, `--json`
and exit status of a direct run; a stale advertisement is ignored."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api_helpers import make_family

pytestmark = pytest.mark.duckdb_only("DuckDB's one-process file lock")

REPO = Path(__file__).resolve().parent.parent


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MERGEPIPE_")}
    e.setdefault("PYTHONPATH", str(REPO))
    return e


def cli(catalog: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", str(catalog), *argv],
                          cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)


def ok(catalog: Path, *argv: str, cwd: Path) -> str:
    p = cli(catalog, *argv, cwd=cwd)
    assert p.returncode == 0, p.stderr
    return p.stdout


def advert_of(catalog: Path) -> Path:
    return catalog.with_name(catalog.name + ".server.json")


class Server:
    def __init__(self, catalog: Path, cwd: Path) -> None:
        self.catalog, self.log = catalog, cwd / "server.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mergepipe", "--catalog", str(catalog), "serve",
                 "--port", "0", "--log-level", "warning", "--data-root", str(cwd)],
                cwd=cwd, env=env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not advert_of(catalog).exists():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        self.advert = json.loads(advert_of(catalog).read_text())

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(60)


@pytest.fixture
def family(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(working directory with the family under family/, catalog with base, e0, e1 ingested)."""
    make_family(tmp_path / "family")
    catalog = tmp_path / "catalog.duckdb"
    ok(catalog, "ingest", "family/base", "--name", "base", cwd=tmp_path)
    for e in ("e0", "e1"):
        ok(catalog, "ingest", f"family/{e}", "--name", e, "--base", "base", cwd=tmp_path)
    yield tmp_path, catalog


PLAN = ["plan", "--base", "base", "--experts", "e0,e1:0.5", "--op", "ties", "--param",
        "density=0.5", "--budget", "0.5"]


def without_timing(text: str) -> str:
    """A plan's output less its planning time (the one thing two runs may differ in)."""
    return "\n".join(line for line in text.splitlines() if "planning" not in line)


READS = [["models"], ["models", "--json"],
         ["sql", "SELECT name, kind, base FROM models ORDER BY name"],
         ["sql", "SELECT name, n_tensors FROM models ORDER BY name", "--json"],
         PLAN, [*PLAN, "--json"], [*PLAN, "--blocks", "3"]]
FAILING = [["sql", "SELECT nope FROM models"], ["sql", "DROP TABLE models"],
           ["plan", "--base", "base", "--experts", "nobody", "--op", "ties"],
           ["replay", "m-nonexistent"], ["rm", "nobody"]]


def test_commands_beside_a_server_answer_as_direct_runs(family: tuple[Path, Path]) -> None:
    """A read, a plan and a refusal through a running server, then writes (ingest, merge):
    the direct runs' output, exit status and errors."""
    beside_a_server(family, [READS[1], READS[5]], [FAILING[1]])


@pytest.mark.slow
def test_every_command_beside_a_server_answers_as_its_direct_run(
        family: tuple[Path, Path]) -> None:
    beside_a_server(family, READS, FAILING)


def beside_a_server(family: tuple[Path, Path], reads: list[list[str]],
                    failing: list[list[str]]) -> None:
    cwd, catalog = family
    direct = [ok(catalog, *argv, cwd=cwd) for argv in reads]
    direct_fail = [cli(catalog, *argv, cwd=cwd) for argv in failing]

    server = Server(catalog, cwd)
    try:
        advert = advert_of(catalog)
        assert stat.S_IMODE(advert.stat().st_mode) == 0o600
        assert server.advert["pid"] == server.proc.pid and server.advert["port"] > 0
        # without the server's relay the catalog is locked: a direct open says so
        from mergepipe.catalog.db import Catalog, CatalogInUse
        with pytest.raises(CatalogInUse):
            Catalog(catalog)

        for argv, expected in zip(reads, direct, strict=True):
            got = ok(catalog, *argv, cwd=cwd)
            assert without_timing(got) == without_timing(expected), argv
        for argv, expected_run in zip(failing, direct_fail, strict=True):
            run = cli(catalog, *argv, cwd=cwd)
            assert (run.returncode, run.stdout, run.stderr) == (
                expected_run.returncode, expected_run.stdout, expected_run.stderr), argv
            assert run.returncode != 0 and len(run.stderr.splitlines()) == 1

        # writes through the server: a relative path and a relative --out, as a direct run
        line = ok(catalog, "ingest", "family/e2", "--name", "e2", "--base", "base", cwd=cwd)
        assert line.startswith("registered 'e2': full expert of 'base' with statistics"), line
        merged = json.loads(ok(catalog, "merge", "--base", "base", "--experts", "e0,e1,e2",
                               "--op", "ties", "--budget", "0.5", "--out", "out/m", "--json",
                               cwd=cwd))
        assert merged["output"] == str(cwd / "out" / "m")
        assert (cwd / "out" / "m" / "manifest.json").is_file()
        rows = json.loads(ok(catalog, "sql", "SELECT status, expert_bytes_read FROM merges "
                             f"WHERE merge_id = '{merged['merge_id']}'", "--json", cwd=cwd))
        assert rows["rows"] == [["succeeded", merged["expert_bytes_read"]]]
        # and the server's own API sees what the CLI did
        with urllib.request.urlopen(
                f"http://127.0.0.1:{server.advert['port']}/v1/models/e2", timeout=30) as r:
            assert json.loads(r.read())["status"] == "ready"
        # a request without the advertised secret is refused
        req = urllib.request.Request(f"http://127.0.0.1:{server.advert['port']}/v1/cli",
                                     data=json.dumps({"argv": ["models"]}).encode(),
                                     headers={"x-mergepipe-relay-secret": "guess"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 403
        # a command that does not run through a server says so in one line
        p = cli(catalog, "serve", "--port", "0", cwd=cwd)
        assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
        assert "in use by another process" in p.stderr and "Traceback" not in p.stderr
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert not advert_of(catalog).exists()  # removed at a clean exit
    # the server is gone: the same commands run directly again, and the merge replays exactly
    assert ok(catalog, "replay", merged["merge_id"], cwd=cwd).startswith(
        f"replay {merged['merge_id']}: match")
    assert "e2" in ok(catalog, "models", cwd=cwd)


def test_a_stale_advertisement_is_ignored(family: tuple[Path, Path]) -> None:
    cwd, catalog = family
    expected = ok(catalog, "models", "--json", cwd=cwd)
    server = Server(catalog, cwd)
    server.stop(signal.SIGKILL)  # no clean exit: the advertisement stays
    assert advert_of(catalog).exists()
    assert ok(catalog, "models", "--json", cwd=cwd) == expected
    assert not advert_of(catalog).exists()  # the dead server's file is removed
    # an advertisement naming a live process that does not answer: run directly
    advert_of(catalog).write_text(json.dumps({**server.advert, "pid": os.getpid()}))
    advert_of(catalog).chmod(0o600)
    assert ok(catalog, "models", "--json", cwd=cwd) == expected
    # one that others could read is not trusted (nor used): run directly
    advert_of(catalog).chmod(0o644)
    assert ok(catalog, "models", "--json", cwd=cwd) == expected


def test_a_relayed_command_gets_the_callers_settings(family: tuple[Path, Path]) -> None:
    """MERGEPIPE_* settings of the caller apply (here the SQL row limit), not the server's."""
    cwd, catalog = family
    server = Server(catalog, cwd)
    try:
        e: dict[str, Any] = {**env(), "MERGEPIPE_SQL_ROW_LIMIT": "2"}
        p = subprocess.run([sys.executable, "-m", "mergepipe", "--catalog", str(catalog), "sql",
                            "SELECT * FROM range(10)", "--json"], cwd=cwd, env=e,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["rows"] == [[0], [1]] and out["truncated"] is True
    finally:
        assert server.stop() == 0
