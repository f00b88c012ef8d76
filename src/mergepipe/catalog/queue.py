"""The job queue in the catalog: queuing ingestions and merges (claiming their names), job rows."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mergepipe.catalog.connection import Connection, IntegrityError, Row, as_dataclass
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.catalog.fence import Fence, hold_ingest
from mergepipe.catalog.records import new_merge_id
from mergepipe.core.errors import Conflict, MergePipeError
from mergepipe.core.jsonable import dumps
from mergepipe.core.logs import REQUEST_ID
from mergepipe.core.mergekit_slices import PassthroughRequest
from mergepipe.core.request import MergeRequest


@dataclass(frozen=True)
class IngestJobRow:
    """One row of `ingest_jobs`."""

    job_id: str
    model: str               # the name the model will be registered under
    kind: str                # full | delta | lora
    path: str                # resolved path inside a data root
    base: str | None
    block_bytes: int | None  # None: the default block size
    with_stats: bool
    status: str              # queued | running | succeeded | failed
    error: str | None
    done_bytes: int
    total_bytes: int
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    force_base: bool = False  # ingest even when far from its base (migration 0009)
    request_id: str | None = None  # X-Request-ID of the HTTP request that queued it

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Job:
    """A queued job: ('ingest', job_id) or ('merge', merge_id)."""

    kind: str
    id: str


class TooManyJobs(MergePipeError):
    """The job queue is full; retry later."""

    status = 429
    code = "too_many_jobs"


@dataclass(frozen=True)
class NewIngestJob:
    """An ingestion to queue (the model name is claimed when it is queued)."""

    model: str
    kind: str
    path: str
    base: str | None
    block_bytes: int | None = None
    with_stats: bool = True
    field: str = "name"  # the request field that named the model, for errors
    force: bool = False  # register an expert even when far from its base (catalog.delta_norms)


@dataclass(frozen=True)
class NewMerge:
    """A merge to queue (its output name is claimed when it is queued)."""

    request: MergeRequest | PassthroughRequest
    output_name: str
    output_path: str
    field: str = "output.name"
    replace: bool = False  # overwrite: a live model of the output name is replaced
    # a mergekit config's tokenizer plan (jobs.tokenizer.TokenizerPlan.document()), stored with
    # the request under "tokenizer": the merge runs it on its staged output
    tokenizer: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Queued:
    """What `enqueue` queued, in the order to run it."""

    ingest_ids: list[str]
    merge_id: str | None

    @property
    def jobs(self) -> list[Job]:
        return ([Job("ingest", i) for i in self.ingest_ids]
                + ([Job("merge", self.merge_id)] if self.merge_id else []))


def enqueue(cat: Catalog, *, ingests: Sequence[NewIngestJob] = (), merge: NewMerge | None = None,
            max_queued: int | None = None) -> Queued:
    """Queue ingestions and a merge in one transaction: every name they claim must be free and
    the queue must have room for all of them."""
    names = [j.model for j in ingests] + ([merge.output_name] if merge else [])
    if len(set(names)) != len(names):
        raise Conflict(f"the request claims a name twice: {sorted(names)}", field="name")
    with cat.transaction() as conn:
        if max_queued is not None:
            queued = int(conn.execute(load_sql("jobs_count")).one().queued)
            if queued + len(names) > max_queued:
                raise TooManyJobs(f"{queued} jobs are queued (limit {max_queued}); retry when "
                                  "some finished")
        for j in ingests:  # an existing name gets a new version (docs/lifecycle.md)
            _claim(conn, j.model, j.field, in_use_ok=True)
        if merge is not None:
            _claim(conn, merge.output_name, merge.field, in_use_ok=merge.replace)
        job_ids = [_insert_ingest(conn, j) for j in ingests]
        merge_id = _insert_merge(conn, merge) if merge is not None else None
        for job, job_id in zip(ingests, job_ids, strict=True):
            _reserve(conn, job.model, job_id, job.field)
        if merge is not None and merge_id is not None:
            _reserve(conn, merge.output_name, merge_id, merge.field)
    return Queued(job_ids, merge_id)


def _reserve(conn: Connection, name: str, job_id: str, field: str) -> None:
    """The name's row in name_claims: its primary key refuses a name another server or worker
    claimed at the same moment (the checks of `_claim` cannot see an uncommitted claim)."""
    try:  # the whole enqueue rolls back
        conn.execute(load_sql("name_claim_insert"), {"name": name, "job_id": job_id})
    except IntegrityError:
        raise Conflict(f"model name {name!r} is claimed by another queued job",
                       field=field) from None


def _claim(conn: Connection, name: str, field: str, *, in_use_ok: bool = False) -> None:
    """Conflict when `name` is a model (unless `in_use_ok`: a new version of it, or a merge
    replacing it), is being ingested, or is a pending merge's output."""
    if not in_use_ok and conn.execute(load_sql("model_exists"), {"name": name}).scalar_one():
        raise Conflict(f"model name {name!r} is taken; merge with --overwrite to replace it, "
                       "or remove it first (mergepipe rm)", field=field)
    if conn.execute(load_sql("ingest_job_active"), {"model": name}).first() is not None:
        raise Conflict(f"model {name!r} is already being ingested", field=field)
    pending = conn.execute(load_sql("merge_output_pending"), {"name": name}).first()
    if pending is not None:
        raise Conflict(f"{name!r} is the output of pending merge {pending[0]}", field=field)


def _insert_ingest(conn: Connection, j: NewIngestJob) -> str:
    job_id = f"ing-{uuid.uuid4().hex[:16]}"
    conn.execute(load_sql("ingest_job_insert"), {
        "job_id": job_id, "model": j.model, "kind": j.kind, "path": j.path, "base": j.base,
        "block_bytes": j.block_bytes, "with_stats": j.with_stats, "force_base": j.force,
        "request_id": REQUEST_ID.get()})
    return job_id


def _insert_merge(conn: Connection, m: NewMerge) -> str:
    merge_id = new_merge_id()
    r = m.request
    conn.execute(load_sql("merge_insert"), {
        "merge_id": merge_id, "operator": r.operator, "base": r.base,
        "request": dumps({**r.to_dict(), **({"tokenizer": dict(m.tokenizer)}
                                            if m.tokenizer is not None else {})}),
        "params": dumps(r.params), "seed": r.seed,
        "output_name": m.output_name, "output_path": m.output_path,
        "request_id": REQUEST_ID.get()})
    return merge_id


def get_ingest_job(cat: Catalog, job_id: str) -> IngestJobRow | None:
    return _job(cat.query("ingest_job_get", {"job_id": job_id}))


def latest_ingest_job(cat: Catalog, model: str) -> IngestJobRow | None:
    return _job(cat.query("ingest_job_latest", {"model": model}))


def active_ingest_job(cat: Catalog, model: str) -> IngestJobRow | None:
    """The queued or running ingestion of `model`, or None."""
    return _job(cat.query("ingest_job_active", {"model": model}))


def unfinished_ingest_models(cat: Catalog) -> list[IngestJobRow]:
    """The newest job of every name that has no model row yet (ingesting or failed)."""
    return [ingest_job_row(r) for r in cat.query("ingest_job_unfinished")]


def start_ingest_job(cat: Catalog, job_id: str, fence: Fence | None = None) -> None:
    with cat.transaction() as conn:
        hold_ingest(conn, job_id, fence)
        conn.execute(load_sql("ingest_job_start"), {"job_id": job_id})


def finish_ingest_job(cat: Catalog, job_id: str, *, error: str | None, done_bytes: int,
                      total_bytes: int, fence: Fence | None = None) -> None:
    """The job's end (`fence`: refused, LeaseLost, unless its worker still holds it)."""
    with cat.transaction() as conn:
        hold_ingest(conn, job_id, fence)
        conn.execute(load_sql("ingest_job_finish"), {
            "job_id": job_id, "status": "failed" if error else "succeeded", "error": error,
            "done_bytes": done_bytes, "total_bytes": total_bytes})
        conn.execute(load_sql("name_claim_release"), {"job_id": job_id})


def queued_jobs(cat: Catalog) -> list[Job]:
    """Ingestions and merges waiting to run, oldest first."""
    return [Job(str(r.kind), str(r.id)) for r in cat.query("jobs_queued")]


def job_counts(cat: Catalog) -> tuple[int, int]:
    """(queued, running) ingestions and merges."""
    row = cat.query("jobs_count")[0]._mapping
    return int(row["queued"]), int(row["running"])


@dataclass(frozen=True)
class JobStatusCount:
    """How many jobs of one kind are in one status, and how old the oldest of them is."""

    kind: str        # ingest | merge
    status: str
    count: int
    oldest_s: float  # seconds since the oldest was queued


def jobs_by_status(cat: Catalog) -> list[JobStatusCount]:
    return [JobStatusCount(str(r.kind), str(r.status), int(r.n), max(0.0, float(r.oldest_s or 0)))
            for r in cat.query("jobs_by_status")]


def pending_outputs(cat: Catalog) -> set[str]:
    """The output names of queued and running merges (claimed until they end)."""
    return {str(r[0]) for r in cat.query("merge_outputs_pending")}


def recover(cat: Catalog) -> None:
    """Mark the jobs that were running when the process died as failed (one transaction)."""
    with cat.transaction() as conn:
        conn.execute(load_sql("ingest_job_recover"))
        conn.execute(load_sql("merge_recover"))
        conn.execute(load_sql("name_claims_release_finished"))


def ping(cat: Catalog) -> None:
    cat.query("catalog_ping")


def ingest_job_row(r: Row) -> IngestJobRow:
    return as_dataclass(IngestJobRow, r)


def _job(rows: list[Row]) -> IngestJobRow | None:
    return ingest_job_row(rows[0]) if rows else None
