"""task_arithmetic: M = B + lambda * sum_i w_i D_i (normalize divides by sum_i w_i)."""

from __future__ import annotations

import torch

from executor.operators.base import BlockContext, ExpertBlock, read_experts
from executor.operators.sparsify import finish, ordered_sum, weight_total, weighted


def task_arithmetic(base: torch.Tensor, experts: list[ExpertBlock],
                    ctx: BlockContext) -> torch.Tensor:
    """Scaled sum of task vectors; omitted blocks add nothing, coefficients stay fixed."""
    read = read_experts(experts)
    if not read:
        return base.clone()
    mixed = ordered_sum([weighted(e.delta, e.weight) for e in read if e.delta is not None])
    divisor = weight_total(ctx.all_weights) if ctx.normalize(False) else None
    return finish(base, mixed, ctx.lam, divisor)
