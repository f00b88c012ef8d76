"""The record of each merge: its merges row, experts, access set, output tensors and lineage."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mergepipe.catalog.connection import Connection, Row, as_dataclass
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.catalog.fence import Fence, check_not_cancelled, hold
from mergepipe.core.errors import Conflict, NotFound
from mergepipe.core.jsonable import dumps, jsonable
from mergepipe.core.progress import Progress
from mergepipe.core.request import MergeRequest

MAX_LINEAGE_DEPTH = 64
MAX_ERROR_CHARS = 4000


class TouchedBlock(NamedTuple):
    """One expert block of an access set (a tuple: a full-budget plan has 10^5+ of them)."""

    model: str
    tensor: str
    block_index: int
    nbytes: int       # bytes read for the block (LoRA: lora_B rows; lora_A is charged apart)
    utility: float    # |alpha_i| * l2 of the block's delta; 0.0 for fallback experts (unknown)
    rank: int         # position in the access set (0 = first in the planner's order)


@dataclass(frozen=True)
class MergeExpertRow:
    """One expert of a merge: its parameters, planned and realized bytes."""

    position: int
    model: str
    weight: float
    density: float | None
    planned_bytes: int
    bytes_read: int | None = None
    fallback: bool = False  # planned at tensor granularity (no statistics)


@dataclass(frozen=True)
class OutputTensorRow:
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    content_hash: str


@dataclass(frozen=True)
class LineageEdge:
    """child was made from parent (role base | expert | previous) by merge `merge_id`."""

    child: str
    parent: str
    role: str
    weight: float | None
    merge_id: str | None = None
    depth: int | None = None  # distance from the model asked about (lineage queries)


@dataclass(frozen=True)
class MergeRow:
    """One row of `merges` (request, params and plan parsed from their JSON)."""

    merge_id: str
    status: str  # queued | running | succeeded | failed | cancelled
    operator: str
    base: str
    request: dict[str, Any]
    params: dict[str, Any]
    seed: int
    plan_hash: str | None
    plan: dict[str, Any] | None
    budget_bytes: int | None
    full_read_bytes: int | None
    planned_expert_bytes: int | None
    expert_bytes_read: int | None
    base_bytes_read: int | None
    omission_bound: float | None
    output_name: str | None
    output_path: str | None
    output_hash: str | None
    blocks_done: int
    blocks_total: int
    plan_seconds: float | None
    exec_seconds: float | None
    error: str | None
    created_at: str | None
    finished_at: str | None
    strategy: str | None = None        # scratch | incremental (docs/incremental.md)
    previous_merge: str | None = None  # incremental: the merge whose output it reused
    request_id: str | None = None      # X-Request-ID of the HTTP request that queued it
    retired_at: str | None = None      # removed from the listing (docs/lifecycle.md)

    def to_dict(self) -> dict[str, Any]:
        return dict(jsonable(dataclasses.asdict(self)))


@dataclass(frozen=True)
class PlanRecord:
    """What recording a merge's plan writes: plan fields, the experts and the access set."""

    plan_hash: str
    document: dict[str, Any]  # the plan summary plus the trims (replay re-executes it)
    budget_bytes: int
    full_read_bytes: int | None
    planned_expert_bytes: int
    omission_bound: float | None
    blocks_total: int
    plan_seconds: float
    experts: list[MergeExpertRow]
    touched: Sequence[TouchedBlock]


@dataclass(frozen=True)
class OutcomeRecord:
    """What recording a merge's success writes: realized I/O, output hashes and lineage."""

    expert_bytes_read: int
    base_bytes_read: int
    output_hash: str
    output_path: str
    exec_seconds: float
    bytes_by_model: dict[str, int]
    tensors: list[OutputTensorRow]
    lineage: list[LineageEdge] = field(default_factory=list)


def lineage_edges(request: MergeRequest, child: str) -> list[LineageEdge]:
    """child -> base (role base) and child -> each expert (role expert, its weight)."""
    return [LineageEdge(child, request.base, "base", None),
            *(LineageEdge(child, e.model, "expert", e.weight) for e in request.experts)]


def new_merge_id() -> str:
    """'m-' + 12 hex digits."""
    return "m-" + uuid.uuid4().hex[:12]


# -- writes --------------------------------------------------------------------------------------
# Each write takes the merge's `fence` (shared catalog: the lease its worker claimed it under;
# None for a single-process runner) and is refused (LeaseLost, rolled back) without it.
def mark_running(cat: Catalog, merge_id: str, fence: Fence | None = None) -> MergeRow:
    """queued -> running; Conflict if the merge is not queued."""
    with cat.transaction() as conn:
        hold(conn, merge_id, fence)
        claimed = conn.execute(load_sql("merge_start"), {"merge_id": merge_id}).rowcount
    row = get_merge(cat, merge_id)
    if claimed != 1:  # taken by another run, or finished
        raise Conflict(f"merge {merge_id} is {row.status}, not queued", field="merge_id")
    return row


def record_plan(cat: Catalog, merge_id: str, plan: PlanRecord, fence: Fence | None = None
                ) -> None:
    """Plan fields, per-expert planned bytes and the access set, in one transaction."""
    with cat.transaction() as conn:
        hold(conn, merge_id, fence)
        conn.execute(load_sql("merge_planned"), {
            "merge_id": merge_id, "plan_hash": plan.plan_hash, "plan": dumps(plan.document),
            "budget_bytes": plan.budget_bytes, "full_read_bytes": plan.full_read_bytes,
            "planned_expert_bytes": plan.planned_expert_bytes,
            "omission_bound": jsonable(plan.omission_bound), "blocks_total": plan.blocks_total,
            "plan_seconds": plan.plan_seconds})
        e = plan.experts
        conn.execute(load_sql("merge_experts_insert"), {
            "merge_id": merge_id, "positions": [x.position for x in e],
            "models": [x.model for x in e], "weights": [x.weight for x in e],
            "densities": [x.density for x in e], "planned_bytes": [x.planned_bytes for x in e],
            "fallbacks": [x.fallback for x in e]})
        if plan.touched:
            cols = list(zip(*plan.touched, strict=True))
            conn.execute(load_sql("touched_blocks_insert"), {
                "merge_id": merge_id, "models": list(cols[0]), "tensors": list(cols[1]),
                "block_indexes": list(cols[2]), "nbytes": list(cols[3]),
                "utilities": [float(u) for u in cols[4]], "ranks": list(cols[5])})


def record_progress(cat: Catalog, merge_id: str, p: Progress, fence: Fence | None = None
                    ) -> None:
    """Progress of a running merge; MergeCancelled once it was cancelled (the run stops)."""
    with cat.transaction() as conn:
        hold(conn, merge_id, fence)
        n = conn.execute(load_sql("merge_progress"), {
            "merge_id": merge_id, "blocks_done": p.done,
            "expert_bytes_read": p.expert_bytes_read, "base_bytes_read": p.base_bytes_read}
        ).rowcount
        if n == 0:
            check_not_cancelled(conn, merge_id)


def record_success(conn: Connection, merge_id: str, outcome: OutcomeRecord) -> None:
    """Realized I/O, output tensor hashes, lineage and status 'succeeded' (caller's transaction,
    which holds the merge's fence); MergeCancelled (the caller rolls back) if it was cancelled."""
    done = conn.execute(load_sql("merge_succeeded"), {
        "merge_id": merge_id, "expert_bytes_read": outcome.expert_bytes_read,
        "base_bytes_read": outcome.base_bytes_read, "output_hash": outcome.output_hash,
        "output_path": outcome.output_path, "exec_seconds": outcome.exec_seconds}).rowcount
    if done == 0:
        check_not_cancelled(conn, merge_id)
    conn.execute(load_sql("name_claim_release"), {"job_id": merge_id})
    for model, n in outcome.bytes_by_model.items():
        conn.execute(load_sql("merge_experts_read"),
                     {"merge_id": merge_id, "model": model, "bytes_read": n})
    if outcome.tensors:
        t = outcome.tensors
        conn.execute(load_sql("output_tensors_insert"), {
            "merge_id": merge_id, "tensors": [x.tensor for x in t],
            "dtypes": [x.dtype for x in t], "shapes": [list(x.shape) for x in t],
            "hashes": [x.content_hash for x in t]})
    for edge in outcome.lineage:
        conn.execute(load_sql("lineage_insert"), {
            "child": edge.child, "parent": edge.parent, "role": edge.role,
            "weight": edge.weight, "merge_id": merge_id})


def record_strategy(cat: Catalog, merge_id: str, strategy: str,
                    previous_merge: str | None, fence: Fence | None = None) -> None:
    """How a planned merge is computed: scratch, or incremental from `previous_merge`."""
    with cat.transaction() as conn:
        hold(conn, merge_id, fence)
        conn.execute(load_sql("merge_strategy"), {"merge_id": merge_id, "strategy": strategy,
                                                  "previous_merge": previous_merge})


def record_failure(cat: Catalog, merge_id: str, error: str, exec_seconds: float | None,
                   fence: Fence | None = None) -> None:
    """Status 'failed' with the message users see (a succeeded merge is never failed after)."""
    with cat.transaction() as conn:
        hold(conn, merge_id, fence)
        conn.execute(load_sql("merge_failed"), {"merge_id": merge_id,
                                                "error": error[:MAX_ERROR_CHARS],
                                                "exec_seconds": exec_seconds})
        conn.execute(load_sql("name_claim_release"), {"job_id": merge_id})


def cancel_merge(cat: Catalog, merge_id: str) -> bool:
    """A queued or running merge -> 'cancelled' (its output name is free again); False if it
    had already ended. A running merge notices at its next progress report (MergeCancelled)."""
    with cat.transaction() as conn:
        n = conn.execute(load_sql("merge_cancel"), {"merge_id": merge_id,
                                                    "error": "cancelled"}).rowcount
        if n:
            conn.execute(load_sql("name_claim_release"), {"job_id": merge_id})
    return bool(n)


def retire_merge(cat: Catalog, merge_id: str) -> bool:
    """A finished merge leaves the listing (its rows stay); False if it was not finished."""
    with cat.transaction() as conn:
        return bool(conn.execute(load_sql("merge_retire"), {"merge_id": merge_id}).rowcount)


# -- reads ---------------------------------------------------------------------------------------
def find_merge(cat: Catalog, merge_id: str) -> MergeRow | None:
    rows = cat.query("merge_get", {"merge_id": merge_id})
    return merge_row(rows[0]) if rows else None


def get_merge(cat: Catalog, merge_id: str) -> MergeRow:
    """The merge `merge_id`; NotFound if absent."""
    row = find_merge(cat, merge_id)
    if row is None:
        raise NotFound(f"merge {merge_id!r} not found", field="merge_id")
    return row


def list_merges(cat: Catalog, limit: int, offset: int) -> list[MergeRow]:
    """Merges, newest first."""
    return [merge_row(r) for r in cat.query("merge_list", {"limit": limit, "offset": offset})]


def running_merges(cat: Catalog) -> list[MergeRow]:
    return [merge_row(r) for r in cat.query("merge_running")]


def merge_experts(cat: Catalog, merge_id: str) -> list[MergeExpertRow]:
    return [as_dataclass(MergeExpertRow, r)
            for r in cat.query("merge_experts_get", {"merge_id": merge_id})]


def touched_blocks(cat: Catalog, merge_id: str) -> list[TouchedBlock]:
    """A merge's access set in planner order."""
    return [TouchedBlock(*r) for r in cat.query("touched_blocks_get", {"merge_id": merge_id})]


def touched_page(cat: Catalog, merge_id: str, *, after_rank: int, limit: int,
                 offset: int) -> list[TouchedBlock]:
    """One page of the access set; `after_rank` is the cursor (-1: from the start)."""
    return [TouchedBlock(*r) for r in cat.query("touched_blocks_page", {
        "merge_id": merge_id, "after_rank": after_rank, "limit": limit, "offset": offset})]


def touched_count(cat: Catalog, merge_id: str) -> int:
    return int(cat.query("touched_blocks_count", {"merge_id": merge_id})[0][0])


def output_tensors(cat: Catalog, merge_id: str) -> dict[str, str]:
    """tensor -> stored content hash of a merge's output."""
    return {str(r.tensor): str(r.content_hash)
            for r in cat.query("output_tensors_get", {"merge_id": merge_id})}


def lineage(cat: Catalog, name: str) -> tuple[list[LineageEdge], list[LineageEdge]]:
    """(ancestors, descendants) of a model: edges with their depth from `name`."""
    p = {"name": name, "max_depth": MAX_LINEAGE_DEPTH}
    return ([as_dataclass(LineageEdge, r) for r in cat.query("lineage_ancestors", p)],
            [as_dataclass(LineageEdge, r) for r in cat.query("lineage_descendants", p)])


def merge_row(r: Row) -> MergeRow:
    m = dict(r._mapping)
    for k in ("request", "params", "plan"):
        if isinstance(m.get(k), str):
            m[k] = json.loads(m[k])
    return as_dataclass(MergeRow, m)
