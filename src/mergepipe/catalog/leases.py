"""Job leases on a shared (PostgreSQL) catalog: claim with SKIP LOCKED, renew, release, take over."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta

from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.catalog.fence import utc_now
from mergepipe.catalog.queue import Job

# (claim query, lease update, renew, release, id column) per kind of job
_SQL = {
    "ingest": ("ingest_job_claim", "ingest_job_lease", "ingest_job_renew", "ingest_job_release",
               "job_id"),
    "merge": ("merge_claim", "merge_lease", "merge_renew", "merge_release", "merge_id"),
}


@dataclass(frozen=True)
class Claimed:
    """A job this worker now holds; `taken_over`: a dead worker held it while running."""

    job: Job
    taken_over: bool


def worker_id() -> str:
    """host:pid:random, unique among the workers of a catalog."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def claim(cat: Catalog, worker: str, lease_s: float) -> Claimed | None:
    """Take the oldest free ingestion, else the oldest free merge, with a lease of `lease_s`;
    None when there is none. A job whose lease expired while running goes back to queued
    under this worker (a merge's recorded access set is cleared: its plan is made again)."""
    now = utc_now()
    for kind in ("ingest", "merge"):
        find, lease, _, _, key = _SQL[kind]
        with cat.transaction() as conn:
            row = conn.execute(load_sql(find), {"now": now}).first()
            if row is None:
                continue
            job_id = str(row[0])
            conn.execute(load_sql(lease), {key: job_id, "worker": worker,
                                           "until": now + timedelta(seconds=lease_s)})
            if kind == "merge" and row[1] == "running":
                conn.execute(load_sql("merge_plan_clear"), {"merge_id": job_id})
                conn.execute(load_sql("merge_experts_clear"), {"merge_id": job_id})
        return Claimed(Job(kind, job_id), taken_over=row[1] == "running")
    return None


def renew(cat: Catalog, job: Job, worker: str, lease_s: float) -> bool:
    """Extend the lease; False when this worker no longer holds the job."""
    _, _, sql, _, key = _SQL[job.kind]
    with cat.transaction() as conn:
        n = conn.execute(load_sql(sql), {key: job.id, "worker": worker,
                                         "until": utc_now() + timedelta(seconds=lease_s)})
        return n.rowcount == 1


def release(cat: Catalog, job: Job, worker: str, retry_after_s: float = 0.0) -> None:
    """Give a job that has not started back to the queue; no worker claims it again for
    `retry_after_s`. A job waiting for its inputs is put back for later: claimed again at once,
    it would still be the oldest, and a single worker would never take the ingestion of its
    inputs queued after it."""
    _, _, _, sql, key = _SQL[job.kind]
    not_before = utc_now() + timedelta(seconds=retry_after_s) if retry_after_s > 0 else None
    cat.execute(sql, {key: job.id, "worker": worker, "not_before": not_before})
