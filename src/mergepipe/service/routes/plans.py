"""POST /v1/plans: a dry run that returns the plan summary without reading any weights."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from mergepipe.catalog.summaries import plan_tensor_shares
from mergepipe.core.errors import Conflict
from mergepipe.core.jsonable import jsonable
from mergepipe.jobs.planning import plan_for_deviation, plan_merge
from mergepipe.service.requests import body_request
from mergepipe.service.schemas import PlanIn
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["plans"])


@router.post("/plans", summary="Dry run: the plan summary (bytes, bound, hash) of a merge")
def plan(body: PlanIn, st: State,
         tensors: Annotated[bool, Query(description=(
             "also return `tensors`: per base tensor and expert, the expert's bytes and "
             "blocks and how many of them the plan reads (the console's heatmap)"))] = False,
         ) -> dict[str, Any]:
    req = body_request(st, body)
    if req.to_ingest:
        j = req.to_ingest[0]
        raise Conflict(f"{j.field}: {j.path} is not registered yet; register it with POST "
                       "/v1/models, or POST the merge to /v1/merges, which queues its "
                       "ingestion first", field=j.field)
    p = (plan_merge(st.cat, req.request) if body.target_deviation is None
         else plan_for_deviation(st.cat, req.request, body.target_deviation)[1])
    out = dict(jsonable(p.summary()))
    if tensors:
        experts = [e.model for e in req.request.experts]
        out["tensors"] = [c.to_dict() for c in plan_tensor_shares(
            st.cat, req.request.base, experts, p.blocks)]
    return out
