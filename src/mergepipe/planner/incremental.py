"""Strategy of a merge: from scratch, or incremental from a stored merge (docs/incremental.md).

`choose_plan` plans by the request's strategy (scratch by default: the output never depends on
the catalog's history), prices incremental when asked, in expert-side bytes (M_old's included)
under the budget resolved against the scratch full read, and returns the chosen plan with both
prices in `plan.strategy`.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.request import DEFAULT_STRATEGY, MergeRequest
from mergepipe.planner.increments import (
    Increment,
    Previous,
    carried_bounds,
    entry_bound,
    find_increment,
    increment_request,
    rounding_note,
)
from mergepipe.planner.plan import Plan, empty_plan_error, make_plan

# stored merges planned in full, fewest changed experts first (each plan is one more knapsack)
MAX_PRICED = 1


def _json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v


def _previous(row: Any) -> Previous | None:
    try:
        req = MergeRequest.from_dict(_json(row.request))
    except (MergePipeError, KeyError, TypeError, ValueError):
        return None  # a request stored by an older version this one no longer accepts
    doc = _json(row.plan) or {}
    strategy = doc.get("strategy") or {}
    depth = 0
    if strategy.get("chosen") == "incremental":
        depth = int((strategy.get("incremental") or {}).get("chain_depth") or 0)
    full, planned = row.full_read_bytes, row.planned_expert_bytes
    if strategy.get("chosen") == "incremental":  # its own reads' full read, not scratch's
        full = (strategy.get("incremental") or {}).get("full_read_bytes", full)
    return Previous(
        merge_id=str(row.merge_id), model=str(row.model), request=req,
        omission_bound=row.omission_bound, omission_bound_l2=doc.get("omission_bound_l2"),
        # omitted something itself, or carries an earlier merge's omission
        budgeted=(full is not None and planned is not None and planned < full)
        or (row.omission_bound or 0.0) > 0.0,
        dtype=row.dtype_min if row.dtype_min == row.dtype_max else "mixed", chain_depth=depth)


def previous_merges(cat: Catalog, request: MergeRequest) -> list[Previous]:
    """Stored merges of the request's base and operator with a registered output, newest first."""
    with cat.reader() as conn:
        rows = conn.execute(load_sql("incremental_previous"),
                            {"base": request.base, "operator": request.operator}).fetchall()
    return [p for p in map(_previous, rows) if p is not None]


def _increments(cat: Catalog, request: MergeRequest) -> list[Increment]:
    """Increments from stored merges, fewest changed experts first, unbudgeted M_old first."""
    found = [inc for inc in (find_increment(p, request) for p in previous_merges(cat, request))
             if inc is not None]
    # stable: among equals the newest merge comes first
    return sorted(found, key=lambda i: (len(i.changes), i.previous.budgeted))


def _incremental_plan(cat: Catalog, request: MergeRequest, budget_bytes: int, *,
                      complete: bool) -> tuple[Plan | None, Increment | None, str | None]:
    """The cheapest incremental plan, its increment, or why there is none. `complete`: only a
    plan equal to the standard merge up to rounding: a stored merge that omitted nothing, and
    every block of it and of the changed experts read under the budget."""
    why = request.spec.incremental_note(request.params)
    if why is not None:
        return None, None, f"not exact for {why}"
    incs = _increments(cat, request)
    if not incs:
        return None, None, (f"no stored {request.operator} merge of base {request.base!r} whose "
                            "experts differ from this request by added, dropped or reweighted "
                            "experts (same parameters, seed and densities)")
    if complete:
        whole = [i for i in incs if not i.previous.budgeted]
        if not whole:
            return None, None, (f"merge {incs[0].previous.merge_id} was read under a budget: "
                                "an increment of it is not the standard merge")
        incs = whole
    best: tuple[Plan, Increment] | None = None
    reason = None
    for inc in incs[:MAX_PRICED]:
        plan, why = _priced(cat, request, inc, budget_bytes, complete=complete)
        if plan is None:
            reason = why
        elif best is None or plan.planned_expert_bytes < best[0].planned_expert_bytes:
            best = (plan, inc)
    if best is None:
        return None, None, reason
    return best[0], best[1], None


def _priced(cat: Catalog, request: MergeRequest, inc: Increment, budget_bytes: int, *,
            complete: bool) -> tuple[Plan | None, str | None]:
    """The plan of one increment with its carried bounds, or why it cannot be used."""
    if inc.previous.budgeted and inc.previous.omission_bound is None:
        return None, (f"merge {inc.previous.merge_id} read under a budget without a bound: "
                      "its omission could not be carried")
    try:
        plan = make_plan(cat, increment_request(request, inc, budget_bytes))
    except MergePipeError as e:  # e.g. M_old's statistics or files changed
        return None, f"merge {inc.previous.merge_id}: {e}"
    if complete and plan.planned_expert_bytes < plan.full_read_bytes:
        return None, (f"the increment from merge {inc.previous.merge_id} needs "
                      f"{plan.full_read_bytes} expert bytes (its output and the changed "
                      f"experts), over the budget of {budget_bytes}: it would leave blocks out")
    plan.omission_bound, plan.omission_bound_l2 = carried_bounds(
        inc, plan.omission_bound, plan.omission_bound_l2)
    return plan, None


def _cheaper(inc: Plan, scratch: Plan) -> bool:
    """auto, between a complete incremental plan and scratch: the fewer expert-side bytes."""
    return inc.planned_expert_bytes < scratch.planned_expert_bytes


def _price(plan: Plan) -> dict[str, Any]:
    return {"full_read_bytes": plan.full_read_bytes,
            "planned_expert_bytes": plan.planned_expert_bytes,
            "omission_bound": plan.omission_bound, "plan_hash": plan.plan_hash}


def _incremental_doc(plan: Plan | None, inc: Increment | None, why: str | None,
                     out_dtype: str, request: MergeRequest) -> dict[str, Any]:
    if plan is None or inc is None:
        return {"available": False, "reason": why}
    prev = inc.previous
    complete = plan.planned_expert_bytes == plan.full_read_bytes and not prev.budgeted
    return {"available": True, **_price(plan), "complete": complete,
            "previous_merge": prev.merge_id,
            "previous_model": prev.model, "previous_dtype": prev.dtype, "c": inc.c,
            "changes": [ch.to_dict() for ch in inc.changes],
            "carried_bound": prev.omission_bound, "chain_depth": prev.chain_depth + 1,
            "rounding": rounding_note(inc, out_dtype),
            "bound": entry_bound(inc, request, plan.request, out_dtype)}


def choose_plan(cat: Catalog, request: MergeRequest) -> Plan:
    """The plan of `request` by its strategy, with both strategies' prices in `plan.strategy`.

    scratch (the default): never looks at stored merges. incremental: the increment of a stored
    merge; at the full budget only a complete one (InvalidRequest naming why when there is none).
    auto: a complete increment when it plans fewer expert bytes, else scratch. The budget is
    resolved once, against the scratch plan's full read, for both; the chosen plan's
    `full_read_bytes` is that full read (the budget's unit) whatever the strategy.
    A plan that reads no expert byte while some could be read is refused (InvalidRequest naming
    the smallest budget that reads one)."""
    t0 = time.perf_counter()
    scratch = make_plan(cat, replace(request, strategy=DEFAULT_STRATEGY))  # the plan hash of before
    scratch.request = request
    inc_plan: Plan | None = None
    inc: Increment | None = None
    why: str | None = "not priced: strategy scratch"
    full_budget = scratch.budget_bytes >= scratch.full_read_bytes
    if request.strategy != "scratch":  # one knapsack more: only when it may be chosen
        inc_plan, inc, why = _incremental_plan(
            cat, request, scratch.budget_bytes,
            complete=full_budget or request.strategy == "auto")
    if request.strategy == "incremental" and inc_plan is None:
        at = " at the full budget" if full_budget else ""
        raise InvalidRequest(f"strategy incremental{at}: {why}; --strategy scratch merges "
                             "without it", field="strategy")
    chosen = request.strategy
    if chosen == "auto":
        chosen = ("incremental" if inc_plan is not None and _cheaper(inc_plan, scratch)
                  else "scratch")
    out_dtype = request.output_dtype or "out"  # the base's dtype, tensor by tensor
    doc = {"requested": request.strategy, "chosen": chosen, "scratch": _price(scratch),
           "incremental": _incremental_doc(inc_plan, inc, why, out_dtype, request),
           "budget_of": "the scratch full read"}
    plan = scratch
    if chosen == "incremental":
        assert inc_plan is not None
        plan = inc_plan
        plan.full_read_bytes = scratch.full_read_bytes  # the budget's unit, as for scratch
        doc["request"] = request.to_dict()
        doc["executed_request"] = inc_plan.request.to_dict()
    plan.strategy = doc
    plan.planning_seconds = time.perf_counter() - t0
    refuse_empty(plan)
    return plan


def refuse_empty(plan: Plan) -> None:
    """InvalidRequest when the plan reads no expert byte although some block differs from the
    base: such a "merge" is a copy of the base. (Experts equal to the base have no candidate:
    their merge is the base, exactly, and is not refused.)"""
    if plan.planned_expert_bytes == 0 and plan.min_useful_bytes is not None:
        raise empty_plan_error(plan.budget_bytes, plan.min_useful_bytes)


def user_request(plan: Plan) -> MergeRequest:
    """The request the user made: an incremental plan executes another one (M_old + changes)."""
    s = plan.strategy
    if s and s.get("chosen") == "incremental" and s.get("request"):
        return MergeRequest.from_dict(s["request"])
    return plan.request


def executed_request(document: dict[str, Any], request: MergeRequest) -> MergeRequest:
    """The request a recorded plan executed (replay): for an incremental plan, M_old + changes."""
    s = document.get("strategy") or {}
    if s.get("chosen") == "incremental" and s.get("executed_request"):
        return MergeRequest.from_dict(s["executed_request"])
    return request


def previous_of(plan: Plan) -> tuple[str, str, float] | None:
    """(merge id, model, c) of the merge an incremental plan reuses; None from scratch."""
    s = plan.strategy
    if not s or s.get("chosen") != "incremental":
        return None
    i = s["incremental"]
    return str(i["previous_merge"]), str(i["previous_model"]), float(i["c"])


def strategy_of(plan: Plan) -> str:
    """incremental | scratch."""
    s = plan.strategy
    return str(s["chosen"]) if s else "scratch"
