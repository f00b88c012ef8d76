"""POST /v1/plans: a dry run that returns the plan summary without reading any weights."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from mergepipe.catalog.db import Catalog
from mergepipe.service import store
from mergepipe.service.auth import require_token
from mergepipe.service.schemas import PlanIn
from mergepipe.service.state import State
from mergepipe.service.views import require_ready

from mergepipe.core.request import MergeRequest, build_request

router = APIRouter(prefix="/v1", tags=["plans"])


def to_request(body: PlanIn, output_dtype: str | None = None) -> MergeRequest:
    """The validated merge request of a plan / merge body (422 naming the field)."""
    assert body.base and body.experts and body.operator  # PlanIn checks them (or config_yaml)
    experts = [e.model_dump(exclude_none=True) for e in body.experts]
    budget = body.budget.model_dump(exclude_none=True) if body.budget is not None else None
    return build_request(base=body.base, experts=experts, operator=body.operator,
                         params=body.params, budget=budget, seed=body.seed,
                         output_dtype=output_dtype)


def check_inputs(cat: Catalog, req: MergeRequest) -> None:
    """Every input model exists (404) and is ready (409), naming the offending field."""
    require_ready(cat, req.base, "base")
    for i, e in enumerate(req.experts):
        require_ready(cat, e.model, f"experts[{i}].model")


def plan_summary(cat: Catalog, req: MergeRequest) -> dict[str, Any]:
    from mergepipe.planner.plan import make_plan
    return dict(store.jsonable(make_plan(cat, req).summary()))


@router.post("/plans", summary="Dry run: the plan summary (bytes, bound, hash) of a merge")
def plan(body: PlanIn, st: State, request: Request) -> dict[str, Any]:
    from mergepipe.service.config_yaml import body_request
    if body.config_yaml is not None:
        require_token(request)  # a config may name unregistered paths: they get ingested
    req = body_request(st, body)
    check_inputs(st.cat, req)
    return plan_summary(st.cat, req)
