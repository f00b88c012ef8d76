"""Catalog rows as API objects, with the live progress of jobs that are running."""

from __future__ import annotations

from typing import Any

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import ModelRow
from mergepipe.catalog.queue import IngestJobRow, Job
from mergepipe.core.jsonable import jsonable
from mergepipe.jobs.runner import JobRunner


def job_out(job: IngestJobRow, runner: JobRunner) -> dict[str, Any]:
    live = runner.live_progress(Job("ingest", job.job_id))
    return {"id": job.job_id, "kind": "ingest", "model": job.model, "status": job.status,
            "error": job.error, "path": job.path, "base": job.base, "model_kind": job.kind,
            "progress": {"done": live.done if live else job.done_bytes,
                         "total": live.total if live else job.total_bytes, "unit": "bytes"},
            "created_at": job.created_at, "started_at": job.started_at,
            "finished_at": job.finished_at}


def model_out(row: ModelRow | None, job: IngestJobRow | None,
              runner: JobRunner) -> dict[str, Any]:
    """A catalog model, or the ingestion job of a model not (yet) in the catalog."""
    if row is not None:
        out: dict[str, Any] = jsonable(row.to_dict())
    else:
        assert job is not None
        out = {"name": job.model, "kind": job.kind, "path": job.path, "base": job.base,
               "status": "failed" if job.status == "failed" else "ingesting",
               "error": job.error, "created_at": job.created_at}
    out["job"] = job_out(job, runner) if job is not None else None
    return out


def merge_out(row: records.MergeRow, cat: Catalog, runner: JobRunner) -> dict[str, Any]:
    """A merges row with its id, progress (blocks), realized I/O and per-expert reads."""
    out = row.to_dict()
    out["id"] = row.merge_id
    if isinstance(out.get("plan"), dict):  # per-tensor TIES trims: in the manifest, not here
        out["plan"] = {k: v for k, v in out["plan"].items() if k != "trims"}
    live = runner.live_progress(Job("merge", row.merge_id))
    out["progress"] = {"done": live.done if live else row.blocks_done,
                       "total": live.total if live else row.blocks_total, "unit": "blocks"}
    if live:
        out["live"] = jsonable(live)
    out["experts"] = jsonable(records.merge_experts(cat, row.merge_id))
    out["output"] = {"name": row.output_name, "path": row.output_path, "hash": row.output_hash}
    return out
