"""POST /v1/models (an ingestion job); GET models, one model, model statistics, ingestion jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from mergepipe.catalog import queue, summaries
from mergepipe.catalog.lifecycle import resolve_model
from mergepipe.catalog.models import find_model, list_models
from mergepipe.catalog.queue import Job, NewIngestJob, enqueue
from mergepipe.core.errors import Conflict, InvalidRequest, NotFound
from mergepipe.core.jsonable import jsonable
from mergepipe.jobs.lifecycle import remove_model
from mergepipe.service.schemas import (
    IngestJobOut,
    ModelIn,
    ModelList,
    ModelOut,
    ModelRemoved,
    ModelStatsList,
)
from mergepipe.service.state import AppState, State
from mergepipe.service.views import job_out, model_out
from mergepipe.storage.paths import confine_source

router = APIRouter(prefix="/v1", tags=["models"])


@router.post("/models", status_code=202, response_model=IngestJobOut,
             summary="Register a checkpoint: starts an ingestion job")
def register_model(body: ModelIn, response: Response, st: State) -> dict[str, Any]:
    name = body.name  # the schema checked the name, the kind, the base and block_bytes
    if body.base is not None:
        _check_base(st, body.base)
    path = confine_source(body.path, st.settings.data_roots, st.settings.remote_roots)
    queued = enqueue(st.cat, ingests=[NewIngestJob(
        name, body.kind, path, body.base, body.block_bytes, body.stats, force=body.force)],
        max_queued=st.settings.max_queued_jobs)
    (job_id,) = queued.ingest_ids
    st.runner.submit(Job("ingest", job_id))
    response.headers["Location"] = f"/v1/models/{name}"
    job = queue.get_ingest_job(st.cat, job_id)
    assert job is not None
    return job_out(job, st.runner)


def _check_base(st: AppState, base: str) -> None:
    """The base must be ready or still being ingested (the job then waits for it)."""
    # The job first, as in get_one: an ingestion commits its model row before its job's end,
    # so a base whose job ended between the two reads is seen as its row, never as missing.
    job = queue.latest_ingest_job(st.cat, base)
    row = resolve_model(st.cat, base)
    if row is not None:
        if row.base:
            raise InvalidRequest(f"model {base!r} is itself an expert of {row.base!r}; "
                                 "register experts against the base", field="base")
        return
    if job is not None and job.status in ("queued", "running"):
        return
    if job is not None and job.status == "failed":
        raise Conflict(f"base model {base!r} failed to ingest: {job.error}", field="base")
    raise NotFound(f"base model {base!r} not found", field="base")


@router.get("/models", response_model=ModelList, summary="All models, ingesting and failed too")
def list_all(st: State) -> dict[str, Any]:
    # Jobs before models (as in get_one): an ingestion ending between the two reads shows as
    # its model, never as missing from both.
    jobs = queue.unfinished_ingest_models(st.cat)
    rows = [model_out(r, None, st.runner) for r in list_models(st.cat)]
    named = {m.get("family") or m["name"] for m in rows}
    rows += [model_out(None, j, st.runner) for j in jobs if j.model not in named]
    rows.sort(key=lambda m: m["name"])
    return {"models": rows}


@router.get("/models/{name}", response_model=ModelOut, summary="One model and its last ingestion")
def get_one(name: str, st: State) -> dict[str, Any]:
    # The job first: an ingestion commits its model row before its job's end, so a job read as
    # succeeded has its row. Read the other way round, an ingestion ending between the two
    # reads (another replica's worker, a busy machine) gave no row and a finished job: a 404.
    job = queue.latest_ingest_job(st.cat, name)
    row = resolve_model(st.cat, name) or find_model(st.cat, name)  # retired: by its exact key
    if row is None and (job is None or job.status == "succeeded"):
        raise NotFound(f"model {name!r} not found", field="name")
    if row is not None and job is not None and job.status != "succeeded":
        job = job if job.status in ("queued", "running") else None
    return model_out(row, job, st.runner)


@router.delete("/models/{name}", response_model=ModelRemoved,
               summary="Remove (retire) a model: 409 naming its dependants unless forced")
def remove_one(name: str, st: State,
               force: Annotated[bool, Query(description="retire it even though other models, "
                                            "merges or jobs depend on it")] = False,
               delete_files: Annotated[bool, Query(description="also delete its directory if "
                                                   "it is a merge output under the output "
                                                   "root")] = False) -> dict[str, Any]:
    return remove_model(st.cat, name, force=force, delete_files=delete_files,
                        output_root=st.settings.output_root).to_dict()


@router.get("/model-stats", response_model=ModelStatsList,
            summary="Per registered model: blocks, delta statistics, lineage depth")
def model_stats(st: State) -> dict[str, Any]:
    return {"models": jsonable(summaries.model_summaries(st.cat))}


@router.get("/ingestions/{job_id}", response_model=IngestJobOut, summary="One ingestion job")
def get_ingestion(job_id: str, st: State) -> dict[str, Any]:
    job = queue.get_ingest_job(st.cat, job_id)
    if job is None:
        raise NotFound(f"ingestion job {job_id!r} not found", field="job_id")
    return job_out(job, st.runner)
