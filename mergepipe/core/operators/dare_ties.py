"""dare_ties: keyed random drop with rescale, then TIES sign election and disjoint sum."""

from __future__ import annotations

import torch

from mergepipe.core.operators.base import BlockContext, ExpertBlock, read_experts
from mergepipe.core.operators.sparsify import dropped_into, elect_into, finish_into, scale_, scratch


def dare_ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """DARE drop and rescale per expert, then the TIES election (normalize default false)."""
    read = [e for e in read_experts(experts) if e.delta is not None]
    if not read:
        return base.clone()
    rescale = str(ctx.params.get("rescale", "density"))
    dropped = []
    for j, e in enumerate(read):
        assert e.delta is not None
        w = dropped_into(e.delta, e.density, e.key, ctx.flat_offset, rescale,
                         scratch.like(("w", j), base))
        dropped.append(scale_(w, e.weight))
    out = torch.empty_like(base)
    divisor = scratch.like("divisor", base) if ctx.normalize(False) else None
    elect_into(dropped, [e.weight for e in read], out, divisor)
    return finish_into(out, base, ctx.lam, divisor)
