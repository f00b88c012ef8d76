"""dare_ties: keyed random drop with rescale, then TIES sign election and disjoint sum."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.base import read_experts
from mergepipe.core.operators.dare_params import MERGEKIT_PARAMS, RESCALE, rescale_from_mergekit
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def dare_ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """DARE drop and rescale per expert, then the TIES election (normalize default false)."""
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.gta(base, experts, ctx, sparsify=mk.random_mask, consensus=True,
                      normalize_default=False)
    import torch

    from mergepipe.core.operators.sparsify import (
        dropped_into,
        elect_into,
        finish_into,
        scale_,
        scratch,
    )

    read = read_experts(experts)
    if not read:
        return base.clone()
    rescale = str(ctx.params.get("rescale", "density"))
    dropped = []
    for j, e in enumerate(read):
        w = dropped_into(e.delta, e.density, e.key, ctx.flat_offset, rescale,
                         scratch.like(("w", j), base))
        dropped.append(scale_(w, e.weight))
    out = torch.empty_like(base)
    divisor = scratch.like("divisor", base) if ctx.normalize(False) else None
    elect_into(dropped, [e.weight for e in read], out, divisor)
    return finish_into(out, base, ctx.lam, divisor)


SPEC = OperatorSpec(
    name="dare_ties", title="DARE-TIES",
    formula="M = B + lambda * disjoint_sum_i(w_i drop(D_i, density_i) / rescale)",
    kernel=dare_ties, normalize_default=False, additive=False, density=True,
    planning_unit="group",  # measured: closest to the full merge (docs/FIDELITY.md)
    not_incremental="DARE-TIES elects each entry's sign over all experts together: one expert more "
                    "can flip signs everywhere",
    params=(RESCALE,),
    mergekit=MergekitMethod("dare_ties", params=MERGEKIT_PARAMS, translate=rescale_from_mergekit),
    fused=FusedKernel("ties", drop=True),
)
