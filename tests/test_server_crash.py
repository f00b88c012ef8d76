"""SIGKILL `mergepipe serve` in the middle of an ingestion and of a merge, then restart it:
the jobs show as failed, nothing half-made is visible, temp outputs are gone, reruns match."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import factory
from tests.catalogs import new_catalog
from tests.live_server import Api, free_port, start_server

pytestmark = pytest.mark.slow

SHAPES: dict[str, tuple[int, ...]] = {f"model.layers.{i}.mlp.{p}.weight": (1024, 1024) for i in range(6)
          for p in ("up_proj", "down_proj")}


def start(tmp: Path, port: int, catalog: Path | str) -> subprocess.Popen[bytes]:
    return start_server(tmp, {"MERGEPIPE_CATALOG": str(catalog),
                              "MERGEPIPE_DATA_ROOTS": str(tmp / "data"),
                              "MERGEPIPE_OUTPUT_ROOT": str(tmp / "outputs"),
                              "MERGEPIPE_WORKERS": "1"}, port=port)[0]


def kill_when(api: Api, proc: subprocess.Popen[bytes], path: str, status: str) -> bool:
    """SIGKILL the server as soon as GET `path` shows `status`; False if it finished first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        obj = api.ok("GET", path)
        if obj["status"] in (status, "ingesting") and (obj.get("job") or obj)["status"] == status:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            return True
        if obj["status"] in ("ready", "succeeded", "failed"):
            return False
        time.sleep(0.005)
    pytest.fail(f"{path} never reached {status}")


@pytest.mark.duckdb_only("the sole server of a DuckDB catalog fails at its start the jobs it "
                         "was running; on a shared catalog they are taken over after their "
                         "lease instead (tests/test_shared_workers.py)")
def test_sigkill_mid_ingestion_and_mid_merge(tmp_path: Path) -> None:
    data = tmp_path / "data"
    base = factory.make_base(data / "base", seed=0, shapes=SHAPES)
    for i in range(3):
        factory.make_expert(base, data / f"e{i}", seed=10 + i)
    port, catalog = free_port(), new_catalog(tmp_path)
    proc = start(tmp_path, port, catalog)
    api = Api(port)
    try:
        api.ok("POST", "/v1/models", {"name": "base", "path": "base"}, status=202)
        api.wait("/v1/models/base")
        api.ok("POST", "/v1/models", {"name": "e0", "path": "e0", "base": "base"}, status=202)
        killed_ingest = kill_when(api, proc, "/v1/models/e0", "running")
        proc = start(tmp_path, port, catalog)
        if killed_ingest:
            m = api.ok("GET", "/v1/models/e0")
            assert m["status"] == "failed" and "server stopped" in m["error"], m
            rows = api.ok("POST", "/v1/sql", {"sql": "SELECT count(*) FROM blocks "
                                                     "WHERE model = 'e0'"})["rows"]
            assert rows == [[0]]
            api.ok("POST", "/v1/models", {"name": "e0", "path": "e0", "base": "base"}, status=202)
        for e in ("e1", "e2"):
            api.ok("POST", "/v1/models", {"name": e, "path": e, "base": "base"}, status=202)
        for e in ("e0", "e1", "e2"):
            assert api.wait(f"/v1/models/{e}")["status"] == "ready"

        def body(name: str) -> dict[str, object]:
            return {"base": "base", "experts": [{"model": f"e{i}"} for i in range(3)],
                    "operator": "ties", "params": {"density": 0.5}, "budget": {"fraction": 0.9},
                    "seed": 5, "output": {"name": name}}

        job = api.ok("POST", "/v1/merges", body("victim"), status=202)
        killed_merge = kill_when(api, proc, f"/v1/merges/{job['id']}", "running")
        proc = start(tmp_path, port, catalog)
        out = tmp_path / "outputs"
        assert not [p for p in out.iterdir() if ".tmp-" in p.name]
        if killed_merge:
            m = api.ok("GET", f"/v1/merges/{job['id']}")
            assert m["status"] == "failed" and "server stopped" in m["error"], m
            assert not (out / "victim").exists()
            code, err = api.call("GET", "/v1/models/victim")
            assert code == 404, err
        again = api.wait(f"/v1/merges/{api.ok('POST', '/v1/merges', body('rerun'), status=202)['id']}")
        twice = api.wait(f"/v1/merges/{api.ok('POST', '/v1/merges', body('rerun2'), status=202)['id']}")
        assert again["status"] == twice["status"] == "succeeded"
        assert again["output_hash"] == twice["output_hash"]
        assert ((out / "rerun" / "model.safetensors").read_bytes()
                == (out / "rerun2" / "model.safetensors").read_bytes())
        print(f"killed mid-ingestion: {killed_ingest}, mid-merge: {killed_merge}")
        assert killed_ingest or killed_merge, "both jobs finished before they could be killed"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
