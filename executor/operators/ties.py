"""ties: magnitude trim from the catalog threshold, sign election, disjoint (normalized) sum."""

from __future__ import annotations

import torch

from executor.operators.base import BlockContext, ExpertBlock, read_experts
from executor.operators.sparsify import disjoint_sum, finish, magnitude_trim, weighted


def ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """TIES-merging; entries tied at the trim threshold are kept by the keyed rule."""
    read = read_experts(experts)
    if not read:
        return base.clone()
    trimmed = [weighted(magnitude_trim(e.delta, e.trim, e.key, ctx.flat_offset), e.weight)
               for e in read if e.delta is not None]
    mixed, divisor = disjoint_sum(trimmed, [e.weight for e in read])
    return finish(base, mixed, ctx.lam, divisor if ctx.normalize(True) else None)
