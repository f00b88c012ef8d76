"""task_arithmetic: M = B + lambda * sum_i w_i D_i (normalize divides by sum_i w_i)."""

from __future__ import annotations

import torch

from mergepipe.core.operators.base import BlockContext, ExpertBlock, read_experts
from mergepipe.core.operators.sparsify import finish_into, weight_total, weighted_sum_into


def task_arithmetic(base: torch.Tensor, experts: list[ExpertBlock],
                    ctx: BlockContext) -> torch.Tensor:
    """Scaled sum of task vectors; omitted blocks add nothing, coefficients stay fixed."""
    read = [e for e in read_experts(experts) if e.delta is not None]
    if not read:
        return base.clone()
    mixed = weighted_sum_into([e.delta for e in read if e.delta is not None],
                              [e.weight for e in read], torch.empty_like(base))
    divisor = weight_total(ctx.all_weights) if ctx.normalize(False) else None
    return finish_into(mixed, base, ctx.lam, divisor)
