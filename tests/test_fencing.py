"""Fencing on a shared (PostgreSQL) catalog: a stalled worker whose merge was taken over
writes nothing after it resumes (records, output model, progress, publish, clean-up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog import leases, records
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.fence import Fence, LeaseLost
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge, run_merge, submit_merge
from tests import factory
from tests.site_hooks.hold_hooks import child_env, holding

REQ: dict[str, Any] = dict(base="base", experts="e0,e1:0.5", operator="task_arithmetic")


def _family(cat: Catalog, root: Path) -> None:
    base = factory.make_base(root / "base", seed=1)
    ingest_model(cat, base, "base", block_bytes=256)
    for i in range(2):
        ingest_model(cat, factory.make_expert(base, root / f"e{i}", seed=10 + i), f"e{i}",
                     base="base")


def _reference(tmp: Path) -> Path:
    """The output of an uninterrupted run (DuckDB catalog, one process)."""
    with Catalog(tmp / "ref.duckdb") as ref:
        _family(ref, tmp / "fam")
        merge(ref, build_request(**REQ), tmp / "ref-out")
    return tmp / "ref-out"


def _files(d: Path) -> dict[str, bytes]:
    """Every file of an output but those naming its run (manifest, model card)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())
            if p.name not in ("manifest.json", "README.md")}


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _count(cat: Catalog, sql: str, **p: object) -> int:
    return int(cat.query(SQL(sql), p)[0][0])


def test_final_records_of_a_taken_over_run_are_refused(tmp_path: Path,
                                                        postgres_url: str) -> None:
    """Worker A's run is held after executing; its lease expires and B claims the merge.
    A resumes: its publish and success record are refused (LeaseLost), it leaves nothing;
    B then runs the merge to the bytes of an uninterrupted run."""
    want = _reference(tmp_path)
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "hold").touch()
    out = tmp_path / "out" / "merged"
    with Catalog(postgres_url) as cat:
        _family(cat, tmp_path / "fam")
        merge_id = submit_merge(cat, build_request(**REQ), "merged", out).merge_id
        assert merge_id is not None
        got = leases.claim(cat, "A", lease_s=30)
        assert got is not None and got.job.id == merge_id
        errors: list[BaseException] = []

        def run_a() -> None:
            try:
                run_merge(cat, merge_id, fence=Fence("A", "aaaaaa"))
            except BaseException as e:  # noqa: BLE001 - the test reads it
                errors.append(e)

        with holding(hold, "merge_staged"):
            a = threading.Thread(target=run_a)
            a.start()
            _wait(lambda: (hold / "pid").exists(), 30, "run A to stage its output")
            cat.execute(SQL("UPDATE merges SET lease_until = :t WHERE merge_id = :m"),
                        {"t": leases.utc_now() - timedelta(seconds=1), "m": merge_id})
            taken = leases.claim(cat, "B", lease_s=30)
            assert taken is not None and taken.taken_over
            (hold / "hold").unlink()
            a.join(60)
        assert len(errors) == 1 and isinstance(errors[0], LeaseLost), errors
        row = records.get_merge(cat, merge_id)
        assert row.status == "queued" and row.error is None  # B's, untouched by A
        assert _count(cat, "SELECT count(*) FROM models WHERE name = 'merged'") == 0
        assert not out.exists()
        assert sorted(p.name for p in out.parent.iterdir()) == []  # A removed its staging
        run_merge(cat, merge_id, fence=Fence("B", "bbbbbb"))
        row = records.get_merge(cat, merge_id)
        assert row.status == "succeeded"
        assert _files(out) == _files(want)
        assert sorted(p.name for p in out.parent.iterdir()) == ["merged"]


def _worker(url: str, tmp: Path, log: Path, lease_s: float) -> subprocess.Popen[bytes]:
    env = child_env(dict(os.environ, MERGEPIPE_CATALOG=url, MERGEPIPE_LEASE_S=str(lease_s),
                         MERGEPIPE_WORKERS="1", MERGEPIPE_DATA_ROOTS=str(tmp),
                         MERGEPIPE_OUTPUT_ROOT=str(tmp / "out")), tmp / "hold", "merge_staged")
    return subprocess.Popen([sys.executable, "-m", "mergepipe", "worker"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def test_sigstopped_worker_resumes_after_takeover(tmp_path: Path, postgres_url: str) -> None:
    """Two worker processes, a 2 s lease: SIGSTOP the one holding a merge mid-merge; the other
    takes it over and finishes it; SIGCONT the first: its late writes are refused (its log
    says so), the merge ran to success exactly once, with an uninterrupted run's bytes, and
    nothing half-made is left."""
    want = _reference(tmp_path)
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "hold").touch()
    out = tmp_path / "out" / "merged"
    log = tmp_path / "workers.log"
    with Catalog(postgres_url) as cat:
        _family(cat, tmp_path / "fam")
        merge_id = submit_merge(cat, build_request(**REQ), "merged", out).merge_id
        assert merge_id is not None
        a = _worker(postgres_url, tmp_path, log, 2.0)
        b = None
        try:
            _wait(lambda: (hold / "pid").exists(), 60, "worker A to stage the merge")
            assert int((hold / "pid").read_text()) == a.pid
            a.send_signal(signal.SIGSTOP)
            (hold / "hold").unlink()
            b = _worker(postgres_url, tmp_path, log, 2.0)
            _wait(lambda: records.get_merge(cat, merge_id).status == "succeeded", 60,
                  "worker B to take the merge over and finish it")
            a.send_signal(signal.SIGCONT)
            _wait(lambda: "late write was refused" in log.read_text(), 30,
                  "worker A to resume and be refused")
            time.sleep(0.5)  # anything else A would do after the refusal
        finally:
            _stop(a, *([b] if b else []))
        text = log.read_text()
        row = records.get_merge(cat, merge_id)
        assert row.status == "succeeded" and row.error is None, text[-3000:]
        assert "taking over" in text
        assert (hold / "starts").read_text().split() == [str(a.pid), str(b.pid)]
        assert _count(cat, "SELECT attempts FROM merges WHERE merge_id = :m", m=merge_id) == 2
        assert _count(cat, "SELECT count(*) FROM models WHERE name = 'merged'") == 1
        assert _count(cat, "SELECT count(*) FROM output_tensors WHERE merge_id = :m",
                      m=merge_id) == len(records.output_tensors(cat, merge_id))
        assert _count(cat, "SELECT count(*) FROM lineage WHERE merge_id = :m", m=merge_id) == 3
        assert not cat.query(SQL("SELECT * FROM name_claims"))
        assert _files(out) == _files(want)
        assert sorted(p.name for p in out.parent.iterdir()) == ["merged"]


def test_ingestion_of_a_taken_over_job_writes_nothing(tmp_path: Path,
                                                     postgres_url: str) -> None:
    """Worker A's ingestion loses its lease while it reads the checkpoint (B claims the job):
    A's model rows and its job record are refused; B then ingests it."""
    from mergepipe.catalog import queue
    from mergepipe.core.progress import Progress
    from mergepipe.jobs.ingest import run_ingest_job

    base = factory.make_base(tmp_path / "base", seed=1)
    with Catalog(postgres_url) as cat:
        (job_id,) = queue.enqueue(cat, ingests=[queue.NewIngestJob(
            "base", "full", str(base), None)]).ingest_ids
        assert leases.claim(cat, "A", lease_s=30) is not None
        taken: list[bool] = []

        def take_over(_: Progress) -> None:
            if not taken:
                cat.execute(SQL("UPDATE ingest_jobs SET lease_until = :t WHERE job_id = :j"),
                            {"t": leases.utc_now() - timedelta(seconds=1), "j": job_id})
                got = leases.claim(cat, "B", lease_s=30)
                taken.append(got is not None and got.taken_over)

        with pytest.raises(LeaseLost):
            run_ingest_job(cat, job_id, data_roots=(), progress=take_over,
                           fence=Fence("A", "aaaaaa"))
        assert taken == [True]
        assert _count(cat, "SELECT count(*) FROM models WHERE name = 'base'") == 0
        row = queue.get_ingest_job(cat, job_id)
        assert row is not None and row.status == "queued" and row.error is None
        run_ingest_job(cat, job_id, data_roots=(), fence=Fence("B", "bbbbbb"))
        row = queue.get_ingest_job(cat, job_id)
        assert row is not None
        assert row.status == "succeeded", row.error
        assert _count(cat, "SELECT count(*) FROM models WHERE name = 'base'") == 1
