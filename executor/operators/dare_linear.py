"""dare_linear: keyed random drop with rescale, then task arithmetic."""

from __future__ import annotations

import torch

from executor.operators.base import BlockContext, ExpertBlock, read_experts
from executor.operators.sparsify import finish, ordered_sum, random_drop, weight_total, weighted


def dare_linear(base: torch.Tensor, experts: list[ExpertBlock],
                ctx: BlockContext) -> torch.Tensor:
    """M = B + lambda * sum_i w_i DARE(D_i) (normalize divides by sum_i w_i)."""
    read = read_experts(experts)
    if not read:
        return base.clone()
    rescale = str(ctx.params.get("rescale", "density"))
    mixed = ordered_sum([
        weighted(random_drop(e.delta, e.density, e.key, ctx.flat_offset, rescale), e.weight)
        for e in read if e.delta is not None])
    divisor = weight_total(ctx.all_weights) if ctx.normalize(False) else None
    return finish(base, mixed, ctx.lam, divisor)
