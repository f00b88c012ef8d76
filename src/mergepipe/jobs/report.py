"""What a merge reports and records: its summary, and the catalog rows of its plan and outcome."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mergepipe.catalog.records import (
    MergeExpertRow,
    OutcomeRecord,
    OutputTensorRow,
    PlanRecord,
)
from mergepipe.core.jsonable import jsonable
from mergepipe.executor.manifest import io_figures, merge_lineage
from mergepipe.executor.stream import ExecutionResult, Prepared
from mergepipe.planner.incremental import previous_of, strategy_of


@dataclass(frozen=True)
class ExpertIO:
    model: str
    planned_bytes: int
    bytes_read: int


@dataclass(frozen=True)
class MergeSummary:
    """The result of one merge (the fields of docs/cli.md's `merge --json`, timings and per-expert I/O)."""

    merge_id: str | None
    plan_hash: str
    operator: str
    budget_bytes: int
    full_read_bytes: int | None
    planned_expert_bytes: int
    expert_bytes_read: int
    base_bytes_read: int
    omission_bound: float | None
    omission_bound_l2: float | None
    predicted_deviation: float | None  # docs/deviation.md#predicted-deviation
    output: str
    output_name: str | None
    output_hash: str
    blocks_total: int
    expert_blocks_read: int
    experts: list[ExpertIO] = field(default_factory=list)
    plan_seconds: float | None = None
    exec_seconds: float = 0.0
    wall_seconds: float = 0.0
    status: str = "succeeded"
    strategy: str = "scratch"          # scratch | incremental (docs/incremental.md)
    previous_merge: str | None = None  # incremental: the merge whose output it reused

    def to_dict(self) -> dict[str, Any]:
        return dict(jsonable(asdict(self)))


def summary(merge_id: str | None, prep: Prepared, result: ExecutionResult, *, output: Path | str,
            output_name: str | None, plan_seconds: float | None,
            wall_seconds: float) -> MergeSummary:
    plan = prep.plan
    previous = previous_of(plan)
    return MergeSummary(
        merge_id=merge_id, plan_hash=plan.plan_hash, operator=plan.request.operator,
        **io_figures(prep, result), output=str(output), output_name=output_name,
        output_hash=result.output_hash, blocks_total=result.blocks_total,
        expert_blocks_read=result.expert_blocks_read,
        experts=[ExpertIO(e.model, prep.planned_by_model[e.model],
                          result.expert_bytes_by_model.get(e.model, 0))
                 for e in plan.request.experts],
        plan_seconds=plan_seconds, exec_seconds=result.exec_seconds, wall_seconds=wall_seconds,
        strategy=strategy_of(plan), previous_merge=previous[0] if previous else None)


def plan_record(prep: Prepared, plan_seconds: float) -> PlanRecord:
    """The catalog rows of a prepared plan: its fields, its experts and its access set."""
    plan = prep.plan
    req = plan.request
    densities = req.densities()
    fallback = set(plan.fallback_experts)
    return PlanRecord(
        plan_hash=plan.plan_hash, document=plan.document(), budget_bytes=plan.budget_bytes,
        full_read_bytes=plan.full_read_bytes, planned_expert_bytes=prep.planned_bytes,
        omission_bound=plan.omission_bound, blocks_total=len(prep.base.blocks),
        plan_seconds=plan_seconds,
        experts=[MergeExpertRow(i, e.model, e.weight, densities[i] if req.spec.density else None,
                                prep.planned_by_model[e.model], fallback=e.model in fallback)
                 for i, e in enumerate(req.experts)],
        touched=plan.blocks)


def outcome_record(prep: Prepared, result: ExecutionResult, output_name: str,
                   target: Path | str) -> OutcomeRecord:
    """The catalog rows of a succeeded merge: realized I/O, output hashes, lineage."""
    return OutcomeRecord(
        expert_bytes_read=result.expert_bytes_read, base_bytes_read=result.base_bytes_read,
        output_hash=result.output_hash, output_path=str(target),
        exec_seconds=result.exec_seconds, bytes_by_model=dict(result.expert_bytes_by_model),
        tensors=[OutputTensorRow(t.name, t.dtype, tuple(t.shape), t.content_hash)
                 for t in result.tensors],
        lineage=merge_lineage(prep.plan, output_name))
