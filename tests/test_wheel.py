"""The wheel, built from a clean copy of the checkout and installed in a fresh venv, is one
`mergepipe` package that carries its migrations and SQL and runs without the checkout."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import factory
from tests.catalogs import new_catalog

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Installed:
    """A fresh venv holding the wheel; dependencies come from this venv's site-packages."""

    venv: Path
    site: Path
    wheel: Path
    bare_top: frozenset[str]  # the top level of `site` before the wheel was installed

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def script(self) -> Path:
        return self.venv / "bin" / "mergepipe"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment minus anything that could point Python or MergePipe at the checkout."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("MERGEPIPE_")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra or {})
    return env


def _copy_checkout(dest: Path) -> None:
    """What git tracks or would track (uncommitted work included, ignored files not), links kept."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = REPO / rel
        if not os.path.lexists(src):  # deleted in the working tree, not yet committed
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _build(root: Path) -> Installed:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout (the wheel is built from what git lists)")
    assert importlib.util.find_spec("setuptools"), \
        "setuptools (in the test extra) is needed to build the wheel without build isolation"
    src, dist, venv = root / "src", root / "dist", root / "venv"
    _copy_checkout(src)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist),
         str(src))
    (wheel,) = dist.glob("mergepipe-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, env=clean_env()).stdout.strip())
    bare_top = frozenset(p.name for p in site.iterdir())
    # The dependencies, importable without reinstalling them: plain path lines (a .pth file in
    # that directory, such as an editable install's finder, is not executed from here).
    outer = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (site / "_outer_deps.pth").write_text("".join(f"{p}\n" for p in outer))
    _pip("--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", "-q",
         str(wheel))
    return Installed(venv, site, wheel, bare_top | {"_outer_deps.pth"})


_BUILT: dict[str, Installed] = {}


def wheel_install(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build and install the wheel once per session (test_docker_files uses it too)."""
    if "it" not in _BUILT:
        _BUILT["it"] = _build(tmp_path_factory.mktemp("wheel"))
    return _BUILT["it"]


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return wheel_install(tmp_path_factory)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory outside the checkout."""
    work = tmp_path / "work"
    work.mkdir()
    assert not work.resolve().is_relative_to(REPO)
    return work


def run_cli(inst: Installed, cwd: Path, *args: str) -> Any:
    proc = subprocess.run([str(inst.script), "--catalog", str(cwd / "catalog.duckdb"), *args],
                          cwd=cwd, capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return json.loads(proc.stdout)


def test_wheel_installs_only_mergepipe(installed: Installed) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    added = {p.name for p in installed.site.iterdir()} - installed.bare_top
    assert added == {"mergepipe", f"mergepipe-{version}.dist-info"}, sorted(added)
    pkg = installed.site / "mergepipe"
    for sub in ("catalog", "storage", "sandbox", "planner", "executor", "service", "migrations",
                "core", "jobs", "cli"):
        assert (pkg / sub / "__init__.py").is_file(), sub
        assert not (pkg / sub).is_symlink(), sub  # real copies, not links into a checkout
    # the benchmark suite is a distribution of its own (benchmarks/), not in the product's wheel
    assert not (pkg / "benchmarks").exists()
    schema = pkg / "migrations" / "catalog_schema.sql"
    assert schema.is_file() and not schema.is_symlink()
    assert schema.read_text() == (REPO / "catalog_schema.sql").read_text()
    assert sorted(p.name for p in (pkg / "migrations").glob("[0-9]*.sql")) == \
        sorted(p.name for p in (REPO / "migrations").glob("[0-9]*.sql"))
    assert list((pkg / "catalog" / "sql").glob("*.sql"))
    console = sorted(p.name for p in (REPO / "service" / "console").iterdir())
    assert sorted(p.name for p in (pkg / "service" / "console").iterdir()) == console


@pytest.mark.duckdb_only("the wheel without the cluster extra: its zero-setup DuckDB catalog")
def test_wheel_runs_without_the_checkout(installed: Installed, outside: Path) -> None:
    where = subprocess.run(
        [str(installed.python), "-c",
         "import json, mergepipe, mergepipe.catalog.db as db, importlib.metadata as md;"
         "print(json.dumps([mergepipe.__file__, db.__file__, str(db.migrations()[0][2]),"
         " str(md.distribution('mergepipe').locate_file(''))]))"],
        cwd=outside, capture_output=True, text=True, env=clean_env(), check=True)
    for path in json.loads(where.stdout):
        assert Path(path).is_relative_to(installed.site), path  # the fresh install, not REPO

    data = outside / "data"
    base = factory.make_base(data / "base", seed=0)
    for i in (1, 2):
        factory.make_expert(base, data / f"e{i}", seed=100 + i)
    assert run_cli(installed, outside, "ingest", str(base), "--name", "base", "--json")
    for i in (1, 2):
        assert run_cli(installed, outside, "ingest", str(data / f"e{i}"), "--name", f"e{i}",
                       "--base", "base", "--json")
    merged = run_cli(installed, outside, "merge", "--base", "base", "--experts", "e1,e2",
                     "--op", "ties", "--param", "density=0.5", "--budget", "0.5",
                     "--out", str(outside / "merged"), "--json")
    assert isinstance(merged, dict) and (outside / "merged" / "manifest.json").is_file()
    rows = run_cli(installed, outside, "sql", "SELECT count(*) FROM models", "--json")
    assert rows["rows"] == [[4]]  # base, two experts, the merge output

    applied = subprocess.run(
        [str(installed.python), "-c",
         "import sys; from mergepipe.catalog.db import Catalog;"
         "c = Catalog(sys.argv[1]);"
         "from mergepipe.catalog.connection import SQL;"
         "print(len(c.query(SQL('SELECT version FROM schema_migrations'))))", str(outside / "catalog.duckdb")],
        cwd=outside, capture_output=True, text=True, env=clean_env())
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert int(applied.stdout) == len(list((REPO / "migrations").glob("[0-9]*.sql")))

    port = free_port()
    with serving(installed, outside, ["serve", "--host", "127.0.0.1", "--port", str(port),
                                      "--data-root", str(data), "--output-root",
                                      str(outside / "outputs"), "--log-level", "warning"],
                 {"MERGEPIPE_CATALOG": str(outside / "catalog.duckdb")}, port) as url:
        code, body = http("POST", f"{url}/v1/sql", {"sql": "SELECT count(*) FROM models"})
        assert code == 200 and body["rows"] == [[4]], body
        # the console and the API docs (Swagger UI's files from fastapi-offline's package data)
        for page in ("/", "/console/app.js", "/docs", "/console/api-docs.js",
                     "/docs/assets/swagger-ui-bundle.js"):
            with urllib.request.urlopen(url + page, timeout=30) as r:
                assert r.status == 200 and r.read(), page


@contextmanager
def serving(inst: Installed, cwd: Path, args: list[str], env: Mapping[str, str],
            port: int) -> Iterator[str]:
    """`mergepipe ARGS` (a serve command listening on 127.0.0.1:PORT) from the fresh venv until
    the block ends: up when /healthz answers; SIGTERM then stops it with exit status 0."""
    log_path = cwd / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([str(inst.script), *args], cwd=cwd, env=clean_env(env),
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if http("GET", f"{url}/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "not up in 60 s:\n" + log_path.read_text()
            time.sleep(0.1)
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_no_migrations_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mergepipe.catalog import db

    monkeypatch.setattr(db, "MIGRATIONS_PACKAGE", "mergepipe.core")  # a package without any
    with pytest.raises(RuntimeError, match=r"no migrations found in mergepipe\.core: the "
                                           r"installation is incomplete"):
        db.Catalog(new_catalog(tmp_path))
