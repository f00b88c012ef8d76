"""Ingestion statistics on a real local Ray runtime, one task per shard file: the catalog rows of
the local scan, row for row; a Ray worker killed mid-shard is retried with the same rows; a
shard task opens its files under the caller's data-root confinement."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import NewIngestJob
from mergepipe.catalog.scan import TensorPlan
from mergepipe.cli.main import main
from mergepipe.core.errors import Forbidden
from mergepipe.executor.engine import LOCAL, Engine
from mergepipe.executor.ray_ingest import ray_scan
from mergepipe.jobs.ingest import run_ingestion
from mergepipe.storage.checkpoint import open_checkpoint
from mergepipe.storage.fsconfine import confined
from mergepipe.storage.grid import block_rows
from tests import factory
from tests.api_helpers import EXPERTS, client_for, register_family, settings_for
from tests.catalogs import ingest_status
from tests.crash_helpers import alive

RAY = Engine("ray")
SHARDS = 3  # more shards than the runtime's 2 CPUs: a task waits for a free one
TABLES = ("models", "files", "tensors", "blocks", "block_stats", "tensor_stats")
TIMING = ("ingest_seconds", "created_at")  # when and how long, not what was read


def family(root: Path) -> list[NewIngestJob]:
    """A 3-shard bf16 base and two full experts (with statistics; one with a zero tensor)."""
    base = factory.make_base(root / "base", seed=5, shards=SHARDS)
    jobs = [NewIngestJob("base", "full", str(base), None, 256)]
    for i in range(2):
        e = factory.make_expert(base, root / f"e{i}", seed=500 + i, shards=SHARDS,
                                zero_tensors=("model.norm.weight",) if i == 0 else ())
        jobs.append(NewIngestJob(f"e{i}", "full", str(e), "base"))
    return jobs


def rows(cat: Catalog) -> dict[str, list[dict[str, Any]]]:
    """Every row of the ingestion tables but its timings, in key order."""
    out = {}
    with cat.reader() as conn:
        for t in TABLES:
            got = [{k: v for k, v in r.items() if k not in TIMING}
                   for r in conn.execute(SQL(f"SELECT * FROM {t}")).mappings()]
            out[t] = sorted(got, key=lambda r: (r.get("model") or r["name"], r.get("tensor", ""),
                                                r.get("block_index", r.get("file_index", 0))))
    return out


def ingest_all(db: Path, jobs: list[NewIngestJob], engine: Engine, **kw: Any) -> dict:
    with Catalog(db) as cat:
        for job in jobs:
            run_ingestion(cat, job, engine=engine, **kw)
        return rows(cat)


def shard_pids(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [int(r.getMessage().rsplit(" ", 1)[1]) for r in caplog.records
            if r.name == "mergepipe.executor.ray_ingest"]


def test_ray_ingestion_writes_the_local_rows(ray_runtime: Path, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A sharded base and two experts ingested locally and on Ray (3 tasks each, in Ray's
    worker processes): every catalog row equal, statistics and trim thresholds included."""
    jobs = family(tmp_path / "fam")
    local = ingest_all(tmp_path / "local.duckdb", jobs, LOCAL)
    with caplog.at_level(logging.DEBUG, logger="mergepipe.executor.ray_ingest"):
        ray = ingest_all(tmp_path / "ray.duckdb", jobs, RAY)
    pids = shard_pids(caplog)
    assert len(pids) == SHARDS * len(jobs) and os.getpid() not in pids
    assert len(local["files"]) == SHARDS * len(jobs)
    assert len(local["block_stats"]) == 2 * len(local["blocks"]) // 3 > 0  # the experts'
    assert len(local["tensor_stats"]) == 2 * local["models"][0]["n_tensors"]
    for t in TABLES:
        assert ray[t] == local[t], t


def _held(hold_dir: Path, run: Any, while_held: Any) -> list[BaseException]:
    """`run()` in a thread while shard 0's task holds; `while_held(pid)` then the hold ends."""
    hold, pid_file = hold_dir / "hold", hold_dir / "pid"
    pid_file.unlink(missing_ok=True)
    (hold_dir / "starts").unlink(missing_ok=True)
    hold.touch()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as e:  # noqa: BLE001 - asserted by the caller
            errors.append(e)

    t = threading.Thread(target=target)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        while_held(int(pid_file.read_text()))
    finally:
        hold.unlink(missing_ok=True)
        t.join(120)
    assert not t.is_alive()
    return errors


@pytest.mark.slow
def test_killed_ray_worker_mid_shard_is_retried_with_identical_rows(ray_runtime: Path,
                                                                    tmp_path: Path) -> None:
    """kill -9 the worker scanning an expert's shard 0 while it holds: Ray runs the task
    again and the catalog rows are the local ingestion's."""
    jobs = family(tmp_path / "fam")
    local = ingest_all(tmp_path / "local.duckdb", jobs, LOCAL)
    with Catalog(tmp_path / "ray.duckdb") as cat:
        run_ingestion(cat, jobs[0], engine=RAY)
        killed: list[int] = []

        def kill(pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not alive(pid)

        errors = _held(ray_runtime, lambda: run_ingestion(cat, jobs[1], engine=RAY), kill)
        assert not errors
        starts = (ray_runtime / "starts").read_text().split()
        assert len(starts) == 2 and starts[0] == str(killed[0]) != starts[1]  # killed, run again
        run_ingestion(cat, jobs[2], engine=RAY)
        assert rows(cat) == local


@pytest.mark.slow
def test_a_shard_task_opens_its_files_under_the_data_roots(ray_runtime: Path,
                                                           tmp_path: Path) -> None:
    """Shard 0's file swapped for a link out of the data root while its task waits (after the
    driver planned from the headers): the task itself refuses it (Forbidden)."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    base = factory.make_base(data / "base", seed=5, shards=SHARDS)
    shutil.copytree(base, outside / "base")
    shard0 = sorted(base.glob("*.safetensors"))[0]
    ckpt = open_checkpoint(base)
    plans = [TensorPlan(t.name, "hash", t, block_rows(t.shape, t.itemsize, 256))
             for t in ckpt.tensors]

    def scan() -> None:
        with confined([data.resolve()]):
            ray_scan(None)(plans, [], None)

    def swap(_pid: int) -> None:
        shard0.unlink()
        shard0.symlink_to(outside / "base" / shard0.name)

    errors = _held(ray_runtime, scan, swap)
    assert len(errors) == 1 and isinstance(errors[0], Forbidden), errors


@pytest.mark.slow  # the fast test covers the rows; this one the CLI's options
def test_cli_ingest_engine_ray_registers_the_local_rows(ray_runtime: Path, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """`mergepipe ingest --engine ray` of a sharded base and expert: one task per shard, the
    rows of `--engine local`."""
    jobs = family(tmp_path / "fam")[:2]
    got = {}
    for engine in ("local", "ray"):
        db = str(tmp_path / f"{engine}.duckdb")
        with caplog.at_level(logging.DEBUG, logger="mergepipe.executor.ray_ingest"):
            for job in jobs:
                base = ["--base", job.base] if job.base else ["--block-bytes", "256"]
                assert main(["--catalog", db, "ingest", job.path, "--name", job.model, *base,
                             "--engine", engine, "--json"]) == 0
        with Catalog(db) as cat:
            got[engine] = rows(cat)
    assert len(shard_pids(caplog)) == SHARDS * len(jobs)
    assert got["ray"] == got["local"]


@pytest.mark.slow  # the fast test covers the rows; this one the job runner's engine
def test_service_workers_ingest_on_ray(ray_runtime: Path, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """MERGEPIPE_ENGINE=ray in a server's job workers: the ingestions posted to the API run one
    Ray task per shard and register the rows of a local ingestion."""
    root = tmp_path / "data" / "fam"
    base = factory.make_base(root / "base", seed=5, shards=SHARDS)
    fam = {"base": base, **{n: factory.make_expert(base, root / n, seed=600 + i, shards=SHARDS)
                            for i, n in enumerate(EXPERTS)}}
    with (caplog.at_level(logging.DEBUG, logger="mergepipe.executor.ray_ingest"),
          client_for(settings_for(tmp_path, engine="ray")) as c):
        register_family(c, fam)
    assert len(shard_pids(caplog)) == SHARDS * len(fam)
    with Catalog(tmp_path / "catalog.duckdb") as cat:
        got = rows(cat)
    jobs = [NewIngestJob(n, "full", str(p), None if n == "base" else "base")
            for n, p in fam.items()]
    assert got == ingest_all(tmp_path / "local.duckdb", jobs, LOCAL)


def _worker(url: str, tmp_path: Path, address: str, log: Path) -> subprocess.Popen[bytes]:
    """`mergepipe worker` on the shared catalog, its ingestions on the session's Ray runtime."""
    env = dict(os.environ, MERGEPIPE_CATALOG=url, MERGEPIPE_LEASE_S="3", MERGEPIPE_WORKERS="1",
               MERGEPIPE_DATA_ROOTS=str(tmp_path), MERGEPIPE_OUTPUT_ROOT=str(tmp_path / "out"),
               MERGEPIPE_ENGINE="ray", MERGEPIPE_RAY_ADDRESS=address)
    return subprocess.Popen([sys.executable, "-m", "mergepipe", "worker"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


@pytest.mark.slow  # two worker processes connecting to Ray, a 3 s lease
def test_kill_9_worker_mid_ray_ingestion_is_taken_over(ray_runtime: Path, tmp_path: Path,
                                                       postgres_url: str) -> None:
    """SIGKILL a `mergepipe worker` (MERGEPIPE_ENGINE=ray) while its ingestion's shard 0 task
    holds: a second worker takes the job over after the lease and registers the rows of a
    local ingestion, once."""
    import ray

    from mergepipe.catalog import queue

    jobs = family(tmp_path / "fam")[:2]
    local = ingest_all(tmp_path / "local.duckdb", jobs, LOCAL)
    address = ray.get_runtime_context().gcs_address
    hold, pid_file, log = ray_runtime / "hold", ray_runtime / "pid", tmp_path / "workers.log"
    with Catalog(postgres_url) as cat:
        run_ingestion(cat, jobs[0])
        (job_id,) = queue.enqueue(cat, ingests=[jobs[1]]).ingest_ids
        pid_file.unlink(missing_ok=True)
        (ray_runtime / "starts").unlink(missing_ok=True)
        hold.touch()
        try:
            a = _worker(postgres_url, tmp_path, address, log)
            try:
                deadline = time.monotonic() + 120
                while not pid_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert pid_file.exists(), log.read_text()[-3000:]
                a.send_signal(signal.SIGKILL)
                a.wait(10)
            finally:
                a.kill()
        finally:
            hold.unlink(missing_ok=True)
        assert ingest_status(cat, job_id) == "running"
        b = _worker(postgres_url, tmp_path, address, log)
        try:
            deadline = time.monotonic() + 120
            while (ingest_status(cat, job_id) not in ("succeeded", "failed")
                   and time.monotonic() < deadline):
                time.sleep(0.1)
        finally:
            b.send_signal(signal.SIGTERM)
            b.wait(30)
        row = queue.get_ingest_job(cat, job_id)
        assert row is not None
        assert row.status == "succeeded", (row.error, log.read_text()[-3000:])
        assert rows(cat) == local
    starts = (ray_runtime / "starts").read_text().split()  # shard 0: A's task, then B's
    assert len(starts) == 2 and starts[0] == pid_file.read_text(), starts
