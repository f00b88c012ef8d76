"""Catalog rows as API objects, and the name / readiness checks the routes share."""

from __future__ import annotations

from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.service import store

from mergepipe.core.errors import Conflict, MergePipeError, NotFound
from mergepipe.jobs.runner import JobRunner

MODEL_FIELDS = ("name", "kind", "path", "base", "status", "error", "has_stats", "block_bytes",
                "n_tensors", "tensor_bytes", "lora_scale", "source_merge", "ingest_seconds",
                "created_at")


def job_out(job: dict[str, Any], runner: JobRunner) -> dict[str, Any]:
    live = runner.live_progress("ingest", job["job_id"]) or {}
    return {"id": job["job_id"], "kind": "ingest", "model": job["model"],
            "status": job["status"], "error": job["error"], "path": job["path"],
            "base": job["base"], "model_kind": job["kind"],
            "progress": {"done": live.get("done", job["done_bytes"]),
                         "total": live.get("total", job["total_bytes"]), "unit": "bytes"},
            "created_at": job["created_at"], "started_at": job["started_at"],
            "finished_at": job["finished_at"]}


def model_out(row: dict[str, Any] | None, job: dict[str, Any] | None,
              runner: JobRunner) -> dict[str, Any]:
    """A catalog model row, or the ingestion job of a model not (yet) in the catalog."""
    if row is not None:
        out = {k: store.jsonable(row.get(k)) for k in MODEL_FIELDS if k in row}
        out.update({k: store.jsonable(v) for k, v in row.items() if k not in out})
    else:
        assert job is not None
        out = {"name": job["model"], "kind": job["kind"], "path": job["path"],
               "base": job["base"],
               "status": "failed" if job["status"] == "failed" else "ingesting",
               "error": job["error"], "created_at": job["created_at"]}
    out["job"] = job_out(job, runner) if job is not None else None
    return out


def find_model(cat: Catalog, name: str) -> dict[str, Any] | None:
    """The catalog row of a model, or None."""
    from mergepipe.catalog.models import get_model
    try:
        return dict(get_model(cat, name))
    except NotFound:
        return None


def require_ready(cat: Catalog, name: str, field: str) -> dict[str, Any]:
    """404 for an unknown model, 409 for one still ingesting or failed."""
    row = find_model(cat, name)
    if row is None:
        if store.active_ingest_job(cat, name):
            raise Conflict(f"model {name!r} is still ingesting; retry when it is ready",
                           field=field)
        job = store.latest_ingest_job(cat, name)
        if job is not None and job["status"] == "failed":
            raise Conflict(f"model {name!r} failed to ingest: {job['error']}", field=field)
        raise NotFound(f"model {name!r} not found", field=field)
    if row.get("status") != "ready":
        raise Conflict(f"model {name!r} is {row.get('status')}, not ready", field=field)
    return row


class TooManyJobs(MergePipeError):
    """The job queue is full; retry later."""

    status = 429
    code = "too_many_jobs"


def ensure_queue_room(cat: Catalog, limit: int) -> None:
    """429 when `limit` ingestions and merges are already queued."""
    queued, _ = store.job_counts(cat)
    if queued >= limit:
        raise TooManyJobs(f"{queued} jobs are queued (limit {limit}); retry when some finished")


def ensure_name_free(cat: Catalog, name: str, field: str) -> None:
    """409 when `name` is a model, is being ingested, or is the output of a pending merge."""
    if find_model(cat, name) is not None:
        raise Conflict(f"model name {name!r} is taken", field=field)
    if store.active_ingest_job(cat, name):
        raise Conflict(f"model {name!r} is already being ingested", field=field)
    merge_id = store.pending_output(cat, name)
    if merge_id:
        raise Conflict(f"{name!r} is the output of pending merge {merge_id}", field=field)


def merge_out(row: dict[str, Any], cat: Catalog, runner: JobRunner) -> dict[str, Any]:
    """A merges row with its id, progress (blocks), realized I/O and per-expert reads."""
    out = dict(row)
    out["id"] = row["merge_id"]
    if isinstance(out.get("plan"), dict):  # per-tensor TIES trims: in the manifest, not here
        out["plan"] = {k: v for k, v in out["plan"].items() if k != "trims"}
    live = runner.live_progress("merge", row["merge_id"]) or {}
    out["progress"] = {"done": live.get("done", row.get("blocks_done") or 0),
                       "total": live.get("total", row.get("blocks_total") or 0),
                       "unit": "blocks"}
    if live:
        out["live"] = live
    out["experts"] = store.merge_experts(cat, row["merge_id"])
    out["output"] = {"name": row.get("output_name"), "path": row.get("output_path"),
                     "hash": row.get("output_hash")}
    return out
