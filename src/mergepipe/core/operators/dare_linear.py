"""dare_linear: keyed random drop with rescale, then task arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.base import read_experts
from mergepipe.core.operators.dare_params import MERGEKIT_PARAMS, RESCALE, rescale_from_mergekit
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def dare_linear(base: torch.Tensor, experts: list[ExpertBlock],
                ctx: BlockContext) -> torch.Tensor:
    """M = B + lambda * sum_i w_i DARE(D_i) (normalize divides by sum_i w_i)."""
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.gta(base, experts, ctx, sparsify=mk.random_mask, consensus=False,
                      normalize_default=False)
    import torch

    from mergepipe.core.operators.sparsify import (
        dropped_into,
        finish_into,
        scale_,
        scratch,
        weight_total,
    )

    read = read_experts(experts)
    if not read:
        return base.clone()
    rescale = str(ctx.params.get("rescale", "density"))
    out = torch.empty_like(base)
    term = scratch.like("term", base)
    for j, e in enumerate(read):
        dst = out if j == 0 else term  # the sum runs left to right in request order
        scale_(dropped_into(e.delta, e.density, e.key, ctx.flat_offset, rescale, dst),
               e.weight)
        if j:
            out.add_(term)
    divisor = weight_total(ctx.all_weights) if ctx.normalize(False) else None
    return finish_into(out, base, ctx.lam, divisor)


SPEC = OperatorSpec(
    name="dare_linear", title="DARE (linear)",
    formula="M = B + lambda * sum_i w_i drop(D_i, density_i) / rescale",
    kernel=dare_linear, normalize_default=False, additive=False, density=True,
    not_incremental=None,
    params=(RESCALE,),
    mergekit=MergekitMethod("dare_linear", params=MERGEKIT_PARAMS, translate=rescale_from_mergekit),
    fused=FusedKernel("linear", drop=True),
)
