"""linear (alias avg): M = B + lambda * sum_i alpha_i D_i, alpha_i = w_i / sum_j w_j (normalize)."""

from __future__ import annotations

import torch

from mergepipe.core.operators.base import BlockContext, ExpertBlock, read_experts
from mergepipe.core.operators.sparsify import finish_into, weight_total, weighted_sum_into


def linear(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """Weighted average of the experts' deltas on the base; omitted blocks add nothing.

    The coefficients are fixed by all experts' weights; with renormalize='selected' the
    divisor is the sum of the weights of the experts read for this block instead.
    """
    read = [e for e in read_experts(experts) if e.delta is not None]
    if not read:
        return base.clone()
    mixed = weighted_sum_into([e.delta for e in read if e.delta is not None],
                              [e.weight for e in read], torch.empty_like(base))
    divisor = None
    if ctx.normalize(True):
        selected = ctx.params.get("renormalize", "fixed") == "selected"
        divisor = weight_total([e.weight for e in read] if selected else ctx.all_weights)
    return finish_into(mixed, base, ctx.lam, divisor)
