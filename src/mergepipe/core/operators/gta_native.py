"""Generalized task arithmetic on float32 blocks: sparsify each read delta, weight it, then a TIES
election or a plain sum (sums left to right in request order; an unread expert adds nothing);
`weighted_sum`, the plain weighted sum of linear and task_arithmetic."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mergepipe.core.operators.base import read_experts

if TYPE_CHECKING:
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock, Operator, ReadExpert
    from mergepipe.core.operators.mergekit_arith import Sparsify

# sparsify(expert, its float32 delta, ctx, j) -> a new float32 tensor (never e.delta itself)
NativeSparsify = Callable[["ReadExpert", "torch.Tensor", "BlockContext", int], "torch.Tensor"]


def gta(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext, *,
        sparsify: NativeSparsify, consensus: bool, normalize_default: bool) -> torch.Tensor:
    """M = B + lambda * (elect or sum)_i w_i sparsify(D_i) (normalize: / the weights' sum)."""
    import torch

    from mergepipe.core.operators.sparsify import (
        elect_into,
        finish_into,
        ordered_sum_into,
        scale_,
        scratch,
        weight_total,
    )

    read = read_experts(experts)
    if not read:
        return base.clone()
    weighted = [scale_(sparsify(e, e.delta, ctx, j), e.weight) for j, e in enumerate(read)]
    out = torch.empty_like(base)
    if consensus:
        divisor = scratch.like("divisor", base) if ctx.normalize(normalize_default) else None
        elect_into(weighted, [e.weight for e in read], out, divisor)
        return finish_into(out, base, ctx.lam, divisor)
    ordered_sum_into(weighted, out)
    total = weight_total(ctx.all_weights) if ctx.normalize(normalize_default) else None
    return finish_into(out, base, ctx.lam, total)


def gta_kernel(mergekit: Sparsify, native: NativeSparsify, *, consensus: bool,
               normalize_default: bool) -> Operator:
    """The kernel of a sparsifying operator: mergekit's arithmetic (mergekit_arith.gta,
    sparsified by `mergekit`) where the request asks for it, else `gta` sparsified by `native`."""

    def kernel(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
               ) -> torch.Tensor:
        from mergepipe.core.operators import mergekit_arith as mk

        if mk.uses_mergekit_arith(ctx):
            return mk.gta(base, experts, ctx, sparsify=mergekit, consensus=consensus,
                          normalize_default=normalize_default)
        return gta(base, experts, ctx, sparsify=native, consensus=consensus,
                   normalize_default=normalize_default)

    return kernel


def weighted_sum(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext,
                 normalize_default: bool) -> torch.Tensor:
    """The float32 sum of the read experts' weighted deltas; the divisor is fixed by all experts'
    weights, or with renormalize='selected' (linear) by those of the experts read for this block."""
    import torch

    from mergepipe.core.operators.sparsify import finish_into, weight_total, weighted_sum_into

    read = read_experts(experts)
    if not read:
        return base.clone()
    mixed = weighted_sum_into([e.delta for e in read],
                              [e.weight for e in read], torch.empty_like(base))
    divisor = None
    if ctx.normalize(normalize_default):
        selected = ctx.params.get("renormalize", "fixed") == "selected"
        divisor = weight_total([e.weight for e in read] if selected else ctx.all_weights)
    return finish_into(mixed, base, ctx.lam, divisor)
