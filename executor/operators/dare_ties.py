"""dare_ties: keyed random drop with rescale, then TIES sign election and disjoint sum."""

from __future__ import annotations

import torch

from executor.operators.base import BlockContext, ExpertBlock, read_experts
from executor.operators.sparsify import disjoint_sum, finish, random_drop, weighted


def dare_ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """DARE drop and rescale per expert, then the TIES election (normalize default false)."""
    read = read_experts(experts)
    if not read:
        return base.clone()
    rescale = str(ctx.params.get("rescale", "density"))
    dropped = [
        weighted(random_drop(e.delta, e.density, e.key, ctx.flat_offset, rescale), e.weight)
        for e in read if e.delta is not None]
    mixed, divisor = disjoint_sum(dropped, [e.weight for e in read])
    return finish(base, mixed, ctx.lam, divisor if ctx.normalize(False) else None)
