"""Issue 29 against a real `mergepipe serve` on loopback: with 50 ingestions held by a remote
that trickles its headers, and 50 merges posted whose configs name URLs on it, /healthz and
GET /v1/models answer within a second (no request thread waits on the network; the
ingestions end at the job time limit); a HEAD claiming a 2^60-byte checkpoint costs the server under 200 MiB and ends in
a refusal (the 4xx code of the job's error), never a block grid built for the claim."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests import factory
from tests.hostile_remotes import Liar, Trickler, wait_until
from tests.live_server import Api, serving

IN_FLIGHT = 50
JOB_TIMEOUT_S = 10
RSS_GROWTH = 200 << 20


@dataclass
class Served:
    proc: psutil.Process
    api: Api
    trickle_url: str
    liar_url: str
    liar: Liar
    trickler: Trickler


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    data = tmp_path / "data"
    factory.make_base(data / "base", seed=0)
    slow, liar = Trickler("headers", interval=0.2), Liar()
    with slow.serve() as trickle_url, liar.serve() as liar_url, serving(tmp_path, {
            "MERGEPIPE_CATALOG": str(tmp_path / "catalog.duckdb"),
            "MERGEPIPE_DATA_ROOTS": str(data), "MERGEPIPE_OUTPUT_ROOT": str(tmp_path / "out"),
            "MERGEPIPE_REMOTE_ROOTS": f"{trickle_url}/allowed {liar_url}/allowed",
            "MERGEPIPE_JOB_TIMEOUT_S": str(JOB_TIMEOUT_S),
            "MERGEPIPE_WORKERS": str(IN_FLIGHT + 2)}) as (proc, api):  # 50 ingestions at once
        # register the base (the imports an ingestion needs are made, not measured)
        api.ok("POST", "/v1/models", {"name": "base", "path": str(data / "base")}, 202)
        assert api.wait("/v1/models/base", timeout=60)["status"] == "ready"
        yield Served(psutil.Process(proc.pid), api, trickle_url, liar_url, liar, slow)


def timed(api: Api, path: str) -> float:
    t0 = time.monotonic()
    try:
        code, _ = api.call("GET", path)
    except OSError:  # the client's own timeout (30 s): as slow as it gets
        return float("inf")
    assert code == 200, path
    return time.monotonic() - t0


def test_healthz_and_models_answer_within_a_second_with_50_trickling_remotes(
        served: Served) -> None:
    api, trickler = served.api, served.trickler
    results: list[int | str] = []  # each POST's status, or the client's error
    threads: list[threading.Thread] = []
    for i in range(IN_FLIGHT):  # 50 ingestions, one per worker, each held by the trickle
        url = f"{served.trickle_url}/allowed/x{i}/model.safetensors"
        api.ok("POST", "/v1/models", {"name": f"x{i}", "path": url, "base": "base"}, 202)
    wait_until(lambda: trickler.open_connections() >= IN_FLIGHT, 10)

    def post(i: int) -> None:  # a config naming a URL of the same remote
        config = (f"merge_method: task_arithmetic\nbase_model: base\nmodels:\n"
                  f"  - model: {served.trickle_url}/allowed/e{i}\n"
                  "    parameters: {weight: 1.0}\n")
        try:
            results.append(api.call("POST", "/v1/merges",
                                    {"config_yaml": config, "output": {"name": f"m{i}"}})[0])
        except OSError as e:
            results.append(repr(e))

    for i in range(IN_FLIGHT):
        t = threading.Thread(target=post, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    t0 = time.monotonic()
    for t in threads:  # on the old code each request is held by the trickle, for ever
        t.join(max(0.0, t0 + 10 - time.monotonic()))
    slowest: dict[str, float] = {}
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        for path in ("/healthz", "/v1/models"):
            slowest[path] = max(slowest.get(path, 0.0), timed(api, path))
        time.sleep(0.05)
    assert trickler.open_connections() >= IN_FLIGHT  # the 50 were trickling all along
    assert max(slowest.values()) < 1.0, slowest
    assert results == [202] * IN_FLIGHT, results
    # each ingestion ended at the job time limit, and says so
    for i in range(IN_FLIGHT):
        job = api.wait(f"/v1/models/x{i}", timeout=JOB_TIMEOUT_S * 3)
        assert job["status"] == "failed", job
        assert f"time limit of {JOB_TIMEOUT_S} s (MERGEPIPE_JOB_TIMEOUT_S)" in job["error"], job


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_a_head_claiming_2_to_the_60_bytes_costs_a_refusal_not_memory(served: Served) -> None:
    proc, api = served.proc, served.api
    rss0, hwm0 = proc.memory_info().rss, vm_hwm(proc.pid)
    url = f"{served.liar_url}/allowed/big/model.safetensors"
    api.ok("POST", "/v1/models", {"name": "big", "path": url}, 202)
    peak, job = rss0, None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        peak = max(peak, proc.memory_info().rss)
        assert peak - rss0 < RSS_GROWTH, f"the server grew by {(peak - rss0) >> 20} MiB"
        job = api.ok("GET", "/v1/models/big")
        if job["status"] != "ingesting":
            break
        time.sleep(0.02)
    assert job is not None and job["status"] == "failed", job
    assert f"claims {served.liar.size} bytes, over the limit" in job["error"], job
    assert max(0, vm_hwm(proc.pid) - hwm0) < RSS_GROWTH
    assert served.liar.requests == 1  # one HEAD, nothing read
