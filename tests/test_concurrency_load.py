"""Heavier concurrency than test_api_concurrency, against a real `mergepipe serve` on loopback:
many merges, ingestions and SQL queries at once (bounded in count and time) all complete, no
catalog conflict reaches a client, and every output equals the same merge run alone."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.api_helpers import EXPERTS, make_family
from tests.catalogs import new_catalog
from tests.live_server import Api, start_server

pytestmark = pytest.mark.slow

TOKEN = "load-token"


def _merges() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, frac in enumerate((0.2, 0.5, 0.8, 1.0)):
        out[f"ties-{i}"] = {"base": "base", "experts": [{"model": e} for e in EXPERTS],
                            "operator": "ties", "params": {"density": 0.3 + 0.1 * i},
                            "budget": {"fraction": frac}, "seed": i}
        out[f"dare-{i}"] = {"base": "base", "experts": [{"model": e, "density": 0.5}
                                                        for e in EXPERTS],
                            "operator": "dare_linear", "budget": {"fraction": frac},
                            "seed": 10 + i}
        out[f"ta-{i}"] = {"base": "base", "experts": [{"model": "e0", "weight": 0.5 + i},
                                                      {"model": "e2", "weight": -0.3}],
                          "operator": "task_arithmetic", "params": {"lambda": 0.7},
                          "budget": {"bytes": 5_000 * (i + 1)}}
    # The default strategy (scratch): never built on a merge stored meanwhile, so each output
    # equals the same merge run alone whatever finished first (docs/incremental.md).
    return out


QUERIES = ("SELECT count(*) FROM models", "SELECT * FROM merges ORDER BY merge_id",
           "SELECT model, sum(nbytes) FROM touched_blocks GROUP BY model",
           "SELECT * FROM lineage", "SELECT status, count(*) FROM ingest_jobs GROUP BY 1",
           "SELECT m.name, count(b.block_index) FROM models m LEFT JOIN blocks b "
           "ON b.model = m.name GROUP BY 1")


def test_many_jobs_and_queries_at_once_through_a_real_server(tmp_path: Path) -> None:
    make_family(tmp_path / "data" / "family")
    proc, api = start_server(tmp_path, {"MERGEPIPE_CATALOG": str(new_catalog(tmp_path)),
                                        "MERGEPIPE_DATA_ROOTS": str(tmp_path / "data"),
                                        "MERGEPIPE_OUTPUT_ROOT": str(tmp_path / "outputs"),
                                        "MERGEPIPE_WORKERS": "4"}, token=TOKEN, up_s=60)
    try:
        api.ok("POST", "/v1/models", {"name": "base", "path": "family/base"}, status=202)
        for e in EXPERTS:
            api.ok("POST", "/v1/models", {"name": e, "path": f"family/{e}", "base": "base"},
                   status=202)
        for m in ("base", *EXPERTS):
            assert api.wait(f"/v1/models/{m}")["status"] == "ready"

        merges = _merges()
        together = _all_at_once(api, merges)
        _check_alone(api, merges, together, tmp_path / "outputs")
        health = api.ok("GET", "/healthz")
        assert health["queued"] == 0 and health["running"] == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(120) == 0
        text = (tmp_path / "server.log").read_text(errors="ignore")
        for word in ("TransactionContext", "Conflict on", "write-write", "Traceback"):
            assert word not in text, text[-3000:]


def _all_at_once(api: Api, merges: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every merge, 8 ingestions and the queries submitted at once; the merges' final jobs,
    all succeeded, and the ingestions ready."""
    failures: list[Any] = []

    def post(path: str, body: dict[str, Any]) -> Any:
        code, obj = api.call("POST", path, body)
        if code >= 300:
            failures.append((path, body, code, obj))
        return obj

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        jobs = {n: pool.submit(post, "/v1/merges", {**b, "output": {"name": n}})
                for n, b in merges.items()}
        ingests = [pool.submit(post, "/v1/models", {"name": f"copy-{i}",
                                                    "path": f"family/{EXPERTS[i % 3]}",
                                                    "base": "base"}) for i in range(8)]
        queries = [pool.submit(post, "/v1/sql", {"sql": q}) for q in QUERIES * 10]
        ids = {n: f.result(timeout=120)["id"] for n, f in jobs.items() if f.result()}
        [f.result(timeout=120) for f in ingests + queries]
    assert not failures, failures[:3]
    together = {n: api.wait(f"/v1/merges/{i}", timeout=600) for n, i in ids.items()}
    for i in range(8):
        assert api.wait(f"/v1/models/copy-{i}", timeout=600)["status"] == "ready"
    print(f"{len(merges)} merges, 8 ingestions, {len(queries)} queries at once: "
          f"{time.monotonic() - t0:.1f} s")
    for n, doc in together.items():
        assert doc["status"] == "succeeded", (n, doc)
    return together


def _check_alone(api: Api, merges: dict[str, dict[str, Any]], together: dict[str, Any],
                 out: Path) -> None:
    """The same merges, one at a time: the same plans, outputs and expert bytes."""
    for n, body in merges.items():
        alone = api.ok("POST", "/v1/merges", {**body, "output": {"name": f"{n}-alone"}},
                       status=202)
        a = api.wait(f"/v1/merges/{alone['id']}", timeout=300)
        assert a["status"] == "succeeded", a
        assert a["plan_hash"] == together[n]["plan_hash"], n
        assert a["output_hash"] == together[n]["output_hash"], n
        assert a["expert_bytes_read"] == together[n]["expert_bytes_read"], n
        assert ((out / n / "model.safetensors").read_bytes()
                == (out / f"{n}-alone" / "model.safetensors").read_bytes()), n
