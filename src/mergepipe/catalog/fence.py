"""Fencing: a job runner writes after its claim only while it still holds the job's lease."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import load_sql
from mergepipe.core.errors import MergePipeError

log = logging.getLogger("mergepipe.catalog.fence")


@dataclass(frozen=True)
class Fence:
    """The lease a worker claimed a job under; `tag`: this claim's suffix of staging names,
    so that a stalled earlier run never writes into the directory of the one that took over."""

    worker: str
    tag: str


class LeaseLost(MergePipeError):
    """This worker's lease on a job expired and another worker took the job over."""

    status = 409
    code = "lease_lost"


class MergeCancelled(LeaseLost):
    """The merge was cancelled while it ran: the run stops and records and publishes nothing
    (a LeaseLost: every path that abandons a lost run abandons a cancelled one)."""

    status = 409
    code = "cancelled"


def utc_now() -> datetime:
    """Lease times are UTC wall-clock time of the workers (keep their clocks in sync)."""
    return datetime.now(UTC).replace(tzinfo=None)


def check_not_cancelled(conn: Connection, merge_id: str) -> None:
    """MergeCancelled if the merge was cancelled (its run must stop and publish nothing)."""
    row = conn.execute(load_sql("merge_status"), {"merge_id": merge_id}).first()
    if row is not None and row[0] == "cancelled":
        raise MergeCancelled(f"merge {merge_id} was cancelled", field="merge_id")


def hold(conn: Connection, merge_id: str, fence: Fence | None) -> None:
    """In the caller's transaction: check that `fence` still holds the merge's lease and lock
    its row until the transaction ends (a takeover skips locked rows); LeaseLost if not, so
    the caller's writes roll back. No fence (a single-process runner): nothing to check."""
    _hold(conn, "merge", merge_id, fence)


def hold_ingest(conn: Connection, job_id: str, fence: Fence | None) -> None:
    """`hold` for an ingestion job."""
    _hold(conn, "ingestion", job_id, fence)


def _hold(conn: Connection, kind: str, job_id: str, fence: Fence | None) -> None:
    if fence is None:
        return
    sql, key = ("merge_fence", "merge_id") if kind == "merge" else ("ingest_job_fence", "job_id")
    row = conn.execute(load_sql(sql), {key: job_id, "worker": fence.worker,
                                       "now": utc_now()}).first()
    if row is None:
        if kind == "merge":
            check_not_cancelled(conn, job_id)
        log.warning("%s %s: worker %s lost its lease (taken over); its late write was "
                    "refused and the run is abandoned", kind, job_id, fence.worker)
        raise LeaseLost(f"{kind} {job_id}: worker {fence.worker} no longer holds its lease; "
                        "another worker took it over; late write refused", field=key)
