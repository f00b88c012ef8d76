"""`mergepipe serve` as a real process on a loopback port: register, merge, chain, query, stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api_helpers import EXPERTS, make_family
from tests.catalogs import new_catalog

REPO = Path(__file__).resolve().parent.parent
TOKEN = "e2e-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mergepipe_command() -> list[str]:
    """The installed `mergepipe` entry point (as in the container), else `python -m mergepipe`."""
    script = Path(sys.executable).parent / "mergepipe"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mergepipe"]


class Api:
    """A minimal JSON client (standard library), as a user's script would be."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        code, obj = self.call(method, path, body)
        assert code == status, (method, path, code, obj)
        return obj

    def wait(self, path: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            obj = self.ok("GET", path)
            if obj["status"] in ("ready", "succeeded", "failed"):
                return dict(obj)
            assert time.monotonic() < deadline, f"{path} still {obj['status']}"
            time.sleep(0.1)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Api, Path]]:
    data = tmp_path / "data"
    make_family(data / "family")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERGEPIPE_")}
    # The container's start command and settings (Dockerfile / docker-compose.yml), on loopback.
    env.update(MERGEPIPE_CATALOG=str(new_catalog(tmp_path)), MERGEPIPE_API_TOKEN=TOKEN,
               MERGEPIPE_DATA_ROOTS=str(data), MERGEPIPE_OUTPUT_ROOT=str(tmp_path / "outputs"),
               MERGEPIPE_WORKERS="2", PYTHONPATH=str(REPO))
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen([*mergepipe_command(), "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    api = Api(port, TOKEN)
    try:
        for _ in range(300):
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if api.call("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("server did not come up in 30 s")
        yield proc, api, tmp_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def test_serve_end_to_end(server: tuple[subprocess.Popen[bytes], Api, Path]) -> None:
    proc, api, tmp = server
    family = tmp / "data" / "family"
    # no token, no write
    code, err = Api(int(api.base.rsplit(":", 1)[1])).call(
        "POST", "/v1/models", {"name": "base", "path": str(family / "base")})
    assert code == 401 and err["error"]["code"] == "unauthorized"

    api.ok("POST", "/v1/models", {"name": "base", "path": str(family / "base"), "kind": "full"},
           status=202)
    for e in EXPERTS:
        api.ok("POST", "/v1/models", {"name": e, "path": f"family/{e}", "kind": "full",
                                      "base": "base"}, status=202)
    for name in ("base", *EXPERTS):
        assert api.wait(f"/v1/models/{name}")["status"] == "ready"

    body = {"base": "base", "experts": [{"model": e, "weight": 1.0} for e in EXPERTS],
            "operator": "ties", "params": {"density": 0.5}, "budget": {"fraction": 0.4},
            "seed": 3, "output": {"name": "ties-40"}}
    job = api.ok("POST", "/v1/merges", body, status=202)
    assert job["status"] == "queued"
    m = api.wait(f"/v1/merges/{job['id']}")
    assert m["status"] == "succeeded", m
    assert 0 < m["expert_bytes_read"] <= m["budget_bytes"] < m["full_read_bytes"]

    man = api.ok("GET", f"/v1/merges/{job['id']}/manifest")
    assert man["merge_id"] == job["id"]
    assert (tmp / "outputs" / "ties-40" / "manifest.json").is_file()

    touched = api.ok("POST", "/v1/sql", {"sql": (
        "SELECT model, count(*) AS blocks, sum(nbytes) AS bytes FROM touched_blocks "
        f"WHERE merge_id = '{job['id']}' GROUP BY model ORDER BY model")})
    assert touched["columns"] == ["model", "blocks", "bytes"]
    assert {r[0] for r in touched["rows"]} <= set(EXPERTS)
    assert sum(r[2] for r in touched["rows"]) <= m["budget_bytes"]
    lineage = api.ok("POST", "/v1/sql", {"sql": "SELECT child, parent, role, weight FROM lineage "
                                                "WHERE child = 'ties-40' ORDER BY parent"})
    assert lineage["rows"] == [["ties-40", "base", "base", None]] + [
        ["ties-40", e, "expert", 1.0] for e in EXPERTS]

    chain = {"base": "base", "experts": [{"model": "ties-40"}, {"model": "e1", "weight": 0.5}],
             "operator": "linear", "budget": {"fraction": 1.0}, "output": {"name": "chained"}}
    job2 = api.ok("POST", "/v1/merges", chain, status=202)
    assert api.wait(f"/v1/merges/{job2['id']}")["status"] == "succeeded"
    lin = api.ok("GET", "/v1/lineage/chained")
    assert lin["depth"] == 2
    assert {(e["parent"], e["depth"]) for e in lin["ancestors"]} >= {
        ("ties-40", 1), ("e1", 1), ("base", 1), ("e0", 2), ("e2", 2)}

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    log = (tmp / "server.log").read_text()
    assert "Traceback" not in log, log
