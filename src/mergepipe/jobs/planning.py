"""Before any weight is read: whether a request's inputs can be merged now, and its dry-run plan."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from mergepipe.catalog import queue
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.lifecycle import resolve_keys, split_ref
from mergepipe.catalog.models import ModelRow, find_models
from mergepipe.core.errors import Conflict, InvalidRequest, NotFound
from mergepipe.core.mergekit_tokenizer import is_vocab_tensor
from mergepipe.core.request import Budget, MergeRequest
from mergepipe.planner.incremental import choose_plan
from mergepipe.planner.plan import Plan, check_budget_reads
from mergepipe.planner.validate import check_request

if TYPE_CHECKING:  # `mergepipe plan` imports this module: not the executor's numpy
    from mergepipe.executor.prepare import Inputs


def check_inputs(cat: Catalog, request: MergeRequest, pending: Collection[str] = (), *,
                 budget: bool = True) -> MergeRequest:
    """The request pinned to exact model versions (`pin_request`), after checking that every
    input model exists and is ready (the error names the field), that the experts are experts
    of the request's base (the planner's validation) and, with `budget`, that the budget reads
    at least one expert byte. Models in `pending` are about to be ingested for this request:
    the plan validates them when it runs."""
    request = pin_request(cat, request, pending)
    fields = [("base", request.base)] + [(f"experts[{i}].model", e.model)
                                         for i, e in enumerate(request.experts)]
    rows = find_models(cat, [name for _, name in fields if name not in pending])
    for field, name in fields:
        if name not in pending:
            require_ready(cat, name, field, rows.get(name))
    if not pending:
        check_request(cat, request)
        if budget:  # the plan itself refuses it too (plan_merge: no need to check twice)
            check_budget_reads(cat, request)
    return request


def check_vocab_rows(request: MergeRequest, inputs: Inputs) -> None:
    """An expert's vocabulary tensor (embeddings, output head) with more rows than the base's
    (catalog.ingest records it so) is merged only by a merge that re-indexes the embeddings
    (a mergekit config's tokenizer options: jobs.reindex reads the tensors whole); otherwise
    refused, naming the expert and the tensor (mergekit fails on it too). `inputs`: the
    request's models (executor.prepare.read_inputs)."""
    base = {t.name: t.shape for t in inputs.tensors[request.base]}
    for i, e in enumerate(request.experts):
        if inputs.rows[e.model].kind == "lora":
            continue  # its lora_B has its own shape
        for t in inputs.tensors[e.model]:
            want = base.get(t.name)
            if want is not None and t.shape != want and is_vocab_tensor(t.name):
                field = f"experts[{i}].model"
                raise InvalidRequest(
                    f"{field}: expert {e.model!r}: tensor {t.name!r} has {t.shape[0]} rows, "
                    f"{want[0]} in the base {request.base!r} (its vocabulary differs from "
                    "the base's): merging it needs a tokenizer option that re-indexes the "
                    "embeddings (a mergekit config's tokenizer_source: union or base)",
                    field=field)


def pin_request(cat: Catalog, request: MergeRequest, pending: Collection[str] = ()
                ) -> MergeRequest:
    """The request with each model name replaced by the key of the version it means now
    (docs/lifecycle.md), so that the merge, its lineage and a replay read exactly those. A
    plain base name means the version of it that the experts were derived from, when they
    agree on one."""
    keys = resolve_keys(cat, [n for n in (request.base, *(e.model for e in request.experts))
                              if n not in pending])
    experts = tuple(e if e.model in pending else replace(e, model=keys[e.model])
                    for e in request.experts)
    base = request.base
    if base not in pending:
        family, version = split_ref(base)
        pinned = keys[base]
        if version is None:
            rows = find_models(cat, [e.model for e in experts])
            bases = {r.base for r in rows.values()}
            if len(bases) == 1 and len(rows) == len(experts):
                derived = bases.pop()
                if derived is not None and split_ref(derived)[0] == family:
                    pinned = derived
        base = pinned
    return replace(request, base=base, experts=experts)


def require_ready(cat: Catalog, name: str, field: str, row: ModelRow | None) -> None:
    """404 for an unknown model (`row` None), 409 for one still ingesting, failed, or not
    ready."""
    if row is None:
        if queue.active_ingest_job(cat, name) is not None:
            raise Conflict(f"model {name!r} is still ingesting; retry when it is ready",
                           field=field)
        job = queue.latest_ingest_job(cat, name)
        if job is not None and job.status == "failed":
            raise Conflict(f"model {name!r} failed to ingest: {job.error}", field=field)
        raise NotFound(f"model {name!r} not found", field=field)
    if row.retired_at is not None:
        raise NotFound(f"model {name!r} was removed (retired at {row.retired_at}); ingest it "
                       "again to use the name", field=field)
    if row.status != "ready":
        raise Conflict(f"model {name!r} is {row.status}, not ready", field=field)


def plan_merge(cat: Catalog, request: MergeRequest) -> Plan:
    """The plan a merge of `request` would execute now (a dry run: nothing is read or recorded),
    by its strategy (`planner.incremental`)."""
    return choose_plan(cat, check_inputs(cat, request, budget=False))


# The budget grid of a target deviation: fractions k / DEVIATION_STEPS of the full read.
DEVIATION_STEPS = 100


@dataclass(frozen=True)
class BudgetSearch:
    """How a target deviation chose its budget (docs/deviation.md#predicted-deviation)."""

    target_deviation: float
    fraction: float               # the budget chosen: the smallest grid point that meets target
    predicted_deviation: float    # its plan's
    below: float | None           # the grid point under it, whose plan misses the target
    below_deviation: float | None  # (None: it reads no expert byte, or it is budget 0)
    resolution: float
    plans: int                    # plans the search made

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_for_deviation(cat: Catalog, request: MergeRequest, target: float
                       ) -> tuple[MergeRequest, Plan, BudgetSearch]:
    """The smallest budget on the grid of fractions k/100 of the full read whose plan's predicted
    deviation is at most `target`: the request with that budget, its plan, and the search.
    A bisection: its answer meets the target and the grid point just under it does not (budget
    0, reading nothing, predicts 1). The full budget predicts 0, so a target in [0, 1] is always
    met; a request without a predicted deviation (no omission bound) is refused."""
    request = check_inputs(cat, request, budget=False)
    made = 0

    def at(k: int) -> tuple[MergeRequest, Plan | None]:
        nonlocal made
        asked = replace(request, budget=Budget(fraction=k / DEVIATION_STEPS))
        made += 1
        try:
            return asked, choose_plan(cat, asked)
        except InvalidRequest as e:
            if e.field == "budget" and k < DEVIATION_STEPS:  # reads no expert byte
                return asked, None
            raise

    hi_req, hi_plan = at(DEVIATION_STEPS)
    assert hi_plan is not None
    full = hi_plan.predicted_deviation
    if full is None:
        why = (hi_plan.omission_bound_note or "no omission bound").removeprefix("no bound: ")
        raise InvalidRequest(f"target deviation: {request.operator} plans of these experts have "
                             f"no predicted deviation ({why}); give a budget instead",
                             field="target_deviation")
    if full > target:  # the full read omits nothing: only rounding could get here
        raise InvalidRequest(f"target deviation {target:g} is not met even by the full read "
                             f"(predicted {full:.6g})", field="target_deviation")
    lo, hi = 0, DEVIATION_STEPS
    lo_dev: float | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        asked, plan = at(mid)
        dev = None if plan is None else plan.predicted_deviation
        if plan is not None and dev is not None and dev <= target:
            hi, hi_req, hi_plan = mid, asked, plan
        else:
            lo, lo_dev = mid, dev
    chosen = hi_plan.predicted_deviation
    assert chosen is not None
    search = BudgetSearch(target, hi / DEVIATION_STEPS, chosen, lo / DEVIATION_STEPS if lo else None,
                          lo_dev if lo else None, 1 / DEVIATION_STEPS, made)
    hi_plan.budget_search = search.to_dict()
    return hi_req, hi_plan, search
