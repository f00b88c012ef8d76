"""Several workers on one real PostgreSQL catalog: claims, leases, takeover after kill -9."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mergepipe.catalog import records
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.errors import Conflict
from mergepipe.core.request import build_request
from mergepipe.core.settings import Settings
from mergepipe.jobs.merge import merge, submit_merge
from mergepipe.jobs.shared_runner import SharedJobRunner
from tests import factory
from tests.catalogs import ingest_status
from tests.site_hooks.hold_hooks import child_env


def _family(cat: Catalog, root: Path, experts: int = 2) -> None:
    base = factory.make_base(root / "base", seed=1)
    ingest_model(cat, base, "base", block_bytes=256)
    for i in range(experts):
        ingest_model(cat, factory.make_expert(base, root / f"e{i}", seed=10 + i), f"e{i}",
                     base="base")


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_two_runners_share_the_queue_each_job_runs_once(tmp_path: Path,
                                                       postgres_url: str) -> None:
    """Two runners (as two processes would) drain four merges: each runs exactly once, and a
    name queued twice at once is refused by its claim."""
    with Catalog(postgres_url) as cat:
        _family(cat, tmp_path / "fam")
        req = build_request(base="base", experts="e0,e1", operator="linear")
        queued = [submit_merge(cat, req, f"out{i}", tmp_path / "out" / f"out{i}").merge_id
                  for i in range(4)]
        ids = [i for i in queued if i is not None]
        assert len(ids) == 4
        with pytest.raises(Conflict):
            submit_merge(cat, req, "out0", tmp_path / "out" / "again")
        s = dataclasses.replace(Settings(), catalog=postgres_url, workers=1, lease_s=5.0,
                                output_root=tmp_path / "out")
        runners = [SharedJobRunner(Catalog(postgres_url, migrate=False), s) for _ in range(2)]
        for r in runners:
            r.start()
        try:
            _wait(lambda: all(records.get_merge(cat, i).status == "succeeded" for i in ids),
                  60, "the merges")
        finally:
            for r in runners:
                r.stop(10)
                r.cat.close()
        rows = [records.get_merge(cat, i) for i in ids]
        assert len({r.output_hash for r in rows}) == 1  # same request, same bytes
        attempts = [a for (a,) in cat.query(_sql("SELECT attempts FROM merges"))]
        assert attempts == [1, 1, 1, 1]
        assert not cat.query(_sql("SELECT * FROM name_claims"))


def test_a_single_worker_runs_a_base_queued_after_its_expert(tmp_path: Path,
                                                           postgres_url: str) -> None:
    """The expert's job waits for its base: put back for later, not claimed again at once (a
    single worker re-claimed it forever and never took the base's ingestion)."""
    from mergepipe.catalog import queue

    base = factory.make_base(tmp_path / "base", seed=1)
    expert = factory.make_expert(base, tmp_path / "e0", seed=2)
    with Catalog(postgres_url) as cat:
        for name, path, of in (("e0", expert, "base"), ("base", base, None)):
            queue.enqueue(cat, ingests=[queue.NewIngestJob(name, "full", str(path), of)])
        s = dataclasses.replace(Settings(), catalog=postgres_url, workers=1, lease_s=5.0,
                                data_roots=(tmp_path,))
        runner = SharedJobRunner(Catalog(postgres_url, migrate=False), s)
        runner.start()
        try:
            _wait(lambda: all(ingest_status(cat, model=n) == "succeeded"
                              for n in ("base", "e0")), 30, "both ingestions")
        finally:
            runner.stop(10)
            runner.cat.close()


def _sql(text: str) -> SQL:
    return SQL(text)


def _worker(url: str, tmp_path: Path, log: Path, hold: Path | None = None
            ) -> subprocess.Popen[bytes]:
    """A `mergepipe worker` on `url`; with `hold`, its ingestions hold on that folder once
    running (tests.site_hooks)."""
    env = dict(os.environ, MERGEPIPE_CATALOG=url, MERGEPIPE_LEASE_S="3", MERGEPIPE_WORKERS="1",
               MERGEPIPE_DATA_ROOTS=str(tmp_path), MERGEPIPE_OUTPUT_ROOT=str(tmp_path / "out"))
    if hold is not None:
        env = child_env(env, hold, "ingest_running")
    return subprocess.Popen([sys.executable, "-m", "mergepipe", "worker"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


@pytest.mark.slow  # two worker processes, a 24 MB family, a 3 s lease
def test_kill_9_worker_mid_merge_is_taken_over(tmp_path: Path, postgres_url: str) -> None:
    """SIGKILL the worker running a merge: another worker takes it over after the lease, the
    output is byte-identical to an uninterrupted run and nothing half-made is left."""
    from mergepipe.cli.family import generate_family

    dirs = generate_family(tmp_path / "fam", experts=2, size_mb=24, seed=3)
    experts = sorted(n for n in dirs if n != "base")
    names = {"base": dirs["base"], **{f"e{i}": dirs[n] for i, n in enumerate(experts)}}
    req = build_request(base="base", experts="e0,e1:0.5", operator="task_arithmetic")
    with Catalog(tmp_path / "ref.duckdb") as ref:
        for n, p in names.items():
            ingest_model(ref, p, n, base=None if n == "base" else "base")
        want = merge(ref, req, tmp_path / "ref-out")
    out = tmp_path / "out" / "merged"
    with Catalog(postgres_url) as cat:
        for n, p in names.items():
            ingest_model(cat, p, n, base=None if n == "base" else "base")
        merge_id = submit_merge(cat, req, "merged", out).merge_id
        assert merge_id is not None
        log = tmp_path / "workers.log"
        a = _worker(postgres_url, tmp_path, log)
        try:
            _wait(lambda: records.get_merge(cat, merge_id).blocks_done > 0, 120,
                  "worker A to start the merge")
            a.send_signal(signal.SIGKILL)
            a.wait(10)
        finally:
            a.kill()
        row = records.get_merge(cat, merge_id)
        assert row.status == "running", "the merge ended before the kill: make it bigger"
        killed_at = time.monotonic()
        b = _worker(postgres_url, tmp_path, log)
        try:
            _wait(lambda: records.get_merge(cat, merge_id).status in ("succeeded", "failed"),
                  90, "worker B to finish the merge")
        finally:
            b.send_signal(signal.SIGTERM)
            b.wait(30)
        took = time.monotonic() - killed_at
        row = records.get_merge(cat, merge_id)
        assert row.status == "succeeded", (row.error, log.read_text()[-3000:])
        assert row.output_hash == want.output_hash and row.plan_hash == want.plan_hash
        got = cat.query(_sql("SELECT attempts FROM merges WHERE merge_id = :m"), {"m": merge_id})
        assert got[0][0] == 2
        assert "taking over" in log.read_text()
        leftovers = [p.name for p in out.parent.iterdir() if p.name != "merged"]
        assert leftovers == [], leftovers
        assert took < 3 + 60
        print(f"merge taken over and finished {took:.1f}s after the kill (lease 3 s)")


def test_two_api_replicas_on_one_catalog(tmp_path: Path, postgres_url: str) -> None:
    """Models registered through one server and a merge submitted to another: either server's
    workers run them, both report the same rows, and SQL runs on the shared catalog."""
    from tests.api_helpers import (
        client_for,
        make_family,
        register_family,
        run_merge,
        settings_for,
        ties_body,
    )

    family = make_family(tmp_path / "data")
    s = settings_for(tmp_path, catalog=postgres_url, workers=1, lease_s=5.0)
    with client_for(s) as a, client_for(s) as b:
        register_family(a, family)
        m = run_merge(b, ties_body("shared-out"))
        assert a.get(f"/v1/merges/{m['id']}").json()["output_hash"] == m["output_hash"]
        names = {x["name"] for x in b.get("/v1/models").json()["models"]}
        assert names >= {"base", "e0", "shared-out"}
        r = a.post("/v1/sql", json={"sql": "SELECT count(*) FROM merges"})
        assert r.status_code == 200 and r.json()["rows"] == [[1]], r.text
        r = b.post("/v1/merges", json=ties_body("shared-out"))
        assert r.status_code == 409, r.text


@pytest.mark.slow  # two worker processes, a 24 MB family, a 3 s lease
def test_kill_9_worker_mid_ingestion_is_taken_over(tmp_path: Path, postgres_url: str) -> None:
    """SIGKILL the worker running an ingestion: another worker ingests it again; the blocks
    and their hashes are those of an uninterrupted ingestion."""
    from mergepipe.catalog import queue
    from mergepipe.cli.family import generate_family

    dirs = generate_family(tmp_path / "fam", experts=1, size_mb=24, seed=4)
    blocks = _sql("SELECT tensor, block_index, content_hash FROM blocks WHERE model = 'base' "
                  "ORDER BY tensor, block_index")
    with Catalog(tmp_path / "ref.duckdb") as ref:
        ingest_model(ref, dirs["base"], "base")
        want = [tuple(r) for r in ref.query(blocks)]
    with Catalog(postgres_url) as cat:
        (job_id,) = queue.enqueue(cat, ingests=[queue.NewIngestJob(
            "base", "full", str(dirs["base"]), None)]).ingest_ids
        log = tmp_path / "workers.log"
        hold = tmp_path / "hold"  # worker A waits in the running job until it is killed
        hold.mkdir()
        (hold / "hold").touch()
        a = _worker(postgres_url, tmp_path, log, hold)
        try:
            _wait(lambda: (hold / "pid").exists(), 120, "worker A to start the ingestion")
            assert ingest_status(cat, job_id) == "running"
            a.send_signal(signal.SIGKILL)
            a.wait(10)
        finally:
            a.kill()
        assert ingest_status(cat, job_id) == "running"
        b = _worker(postgres_url, tmp_path, log)
        try:
            _wait(lambda: ingest_status(cat, job_id) in ("succeeded", "failed"),
                  90, "worker B to finish the ingestion")
        finally:
            b.send_signal(signal.SIGTERM)
            b.wait(30)
        row = queue.get_ingest_job(cat, job_id)
        assert row is not None
        assert row.status == "succeeded", (row.error, log.read_text()[-3000:])
        assert [tuple(r) for r in cat.query(blocks)] == want
        assert not cat.query(_sql("SELECT * FROM name_claims"))
