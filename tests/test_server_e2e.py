"""`mergepipe serve` as a real process on a loopback port: register, merge, chain, query, stop."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api_helpers import EXPERTS, make_family
from tests.catalogs import new_catalog
from tests.live_server import Api, serving

TOKEN = "e2e-token"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Api, Path]]:
    data = tmp_path / "data"
    make_family(data / "family")
    # The container's start command and settings (Dockerfile / docker-compose.yml), on loopback.
    with serving(tmp_path, {"MERGEPIPE_CATALOG": str(new_catalog(tmp_path)),
                            "MERGEPIPE_DATA_ROOTS": str(data),
                            "MERGEPIPE_OUTPUT_ROOT": str(tmp_path / "outputs"),
                            "MERGEPIPE_WORKERS": "2"}, token=TOKEN) as (proc, api):
        yield proc, api, tmp_path


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
