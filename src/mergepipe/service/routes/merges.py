"""POST /v1/merges (a merge job), its status, manifest and touched blocks (paged)."""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from mergepipe.catalog import records, summaries
from mergepipe.core.errors import Conflict, InvalidRequest, NotFound
from mergepipe.core.request import MergeRequest
from mergepipe.executor.manifest import MANIFEST_FILE
from mergepipe.jobs.lifecycle import remove_merge
from mergepipe.jobs.merge import submit_merge
from mergepipe.jobs.planning import plan_for_deviation
from mergepipe.service.requests import merge_request
from mergepipe.service.schemas import (
    IdenticalTensors,
    MergeAccepted,
    MergeIn,
    MergeList,
    MergeOut,
    TensorShares,
    TouchedPage,
)
from mergepipe.service.state import State
from mergepipe.service.views import merge_out
from mergepipe.storage.paths import output_dir

router = APIRouter(prefix="/v1", tags=["merges"])


@router.post("/merges", status_code=202, response_model=MergeAccepted,
             summary="Start a budgeted merge job")
def start_merge(body: MergeIn, response: Response, st: State) -> dict[str, Any]:
    req = merge_request(st, body)
    request, search = req.request, None
    if body.target_deviation is not None and isinstance(request, MergeRequest):
        # the budget is chosen now, on the catalog of now
        if req.to_ingest:
            j = req.to_ingest[0]
            raise Conflict(f"{j.field}: {j.path} is not registered yet; a target deviation "
                           "plans with its statistics: register it with POST /v1/models first",
                           field=j.field)
        request, _, search = plan_for_deviation(st.cat, request, body.target_deviation)
    out = output_dir(st.settings.output_root, body.output.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = req.tokenizer  # the config's tokenizer options: run by the merge
    queued = submit_merge(st.cat, request, body.output.name, out, ingests=req.to_ingest,
                          max_queued=st.settings.max_queued_jobs,
                          tokenizer=None if tokenizer is None else tokenizer.document())
    for job in queued.jobs:  # the ingestions the config needs, then the merge
        st.runner.submit(job)
    merge_id = queued.merge_id
    response.headers["Location"] = f"/v1/merges/{merge_id}"
    return {"id": merge_id, "status": "queued",
            **({"budget_search": search.to_dict()} if search is not None else {})}


@router.get("/merges", response_model=MergeList, summary="Merges, newest first")
def list_all(st: State, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
             offset: Annotated[int, Query(ge=0, le=2**62)] = 0) -> dict[str, Any]:
    return {"merges": [merge_out(r, st.cat, st.runner)
                       for r in records.list_merges(st.cat, limit, offset)]}


@router.get("/merges/{merge_id}", response_model=MergeOut,
            summary="Status, progress, realized I/O and error of a merge")
def get_one(merge_id: str, st: State) -> dict[str, Any]:
    return merge_out(records.get_merge(st.cat, merge_id), st.cat, st.runner)


@router.delete("/merges/{merge_id}", response_model=MergeOut,
               summary="Cancel a queued or running merge, or retire a finished one")
def remove_one(merge_id: str, st: State) -> dict[str, Any]:
    return merge_out(remove_merge(st.cat, merge_id), st.cat, st.runner)


@router.get("/merges/{merge_id}/manifest", summary="The manifest published with the output")
def manifest(merge_id: str, st: State) -> dict[str, Any]:
    row = records.get_merge(st.cat, merge_id)
    if row.status != "succeeded":
        raise Conflict(f"merge {merge_id} is {row.status}; a manifest exists once it "
                       "succeeded", field="merge_id")
    path = Path(row.output_path or "") / MANIFEST_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound(f"the manifest of merge {merge_id} is gone from {path}",
                       field="merge_id") from None
    return data


def _cursor(rank: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rank": rank}).encode()).decode().rstrip("=")


def _after_rank(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        rank = json.loads(raw)["rank"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidRequest("cursor is not one this API returned", field="cursor") from None
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise InvalidRequest("cursor is not one this API returned", field="cursor")
    return rank


@router.get("/merges/{merge_id}/touched-blocks", response_model=TouchedPage,
            summary="The access set of a merge in planner order (limit/offset or cursor)")
def touched_blocks(merge_id: str, st: State,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
                   offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
                   cursor: Annotated[str | None, Query(
                       max_length=200, description="next_cursor of the previous page")] = None) -> dict[str, Any]:
    records.get_merge(st.cat, merge_id)
    if cursor is not None and offset:
        raise InvalidRequest("give either offset or cursor, not both", field="cursor")
    after = _after_rank(cursor) if cursor is not None else -1
    rows = records.touched_page(st.cat, merge_id, after_rank=after, limit=limit + 1,
                                offset=offset)
    more = len(rows) > limit
    rows = rows[:limit]
    return {"merge_id": merge_id, "total": records.touched_count(st.cat, merge_id),
            "limit": limit, "offset": offset,
            "next_cursor": _cursor(rows[-1].rank) if more and rows else None,
            "blocks": [b._asdict() for b in rows]}


@router.get("/merges/{merge_id}/tensor-shares", response_model=TensorShares,
            summary="Per base tensor and expert: its bytes and blocks, and what the merge read")
def tensor_shares(merge_id: str, st: State) -> dict[str, Any]:
    row = records.get_merge(st.cat, merge_id)
    return {"merge_id": merge_id, "base": row.base,
            "experts": [e.model for e in records.merge_experts(st.cat, merge_id)],
            "tensors": [c.to_dict() for c in summaries.merge_tensor_shares(st.cat, merge_id)]}


@router.get("/merges/{merge_id}/identical-tensors", response_model=IdenticalTensors,
            summary="How many output tensors are bit-identical to a reference merge's output")
def identical_tensors(merge_id: str, st: State,
                      reference: Annotated[str, Query(min_length=1, max_length=64)]
                      ) -> dict[str, Any]:
    for mid, field in ((merge_id, "merge_id"), (reference, "reference")):
        row = records.find_merge(st.cat, mid)
        if row is None:
            raise NotFound(f"merge {mid!r} not found", field=field)
        if row.status != "succeeded":
            raise Conflict(f"merge {mid} is {row.status}; outputs are compared once it "
                           "succeeded", field=field)
    tensors, identical = summaries.identical_tensors(st.cat, merge_id, reference)
    return {"merge_id": merge_id, "reference": reference, "tensors": tensors,
            "identical": identical}
