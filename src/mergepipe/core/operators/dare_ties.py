"""dare_ties: keyed random drop with rescale, then TIES sign election and disjoint sum."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.dare_params import MERGEKIT_PARAMS, RESCALE, rescale_from_mergekit
from mergepipe.core.operators.gta_native import gta_either
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock, ReadExpert


def dare_ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """DARE drop and rescale per expert, then the TIES election (normalize default false)."""
    from mergepipe.core.operators.mergekit_arith import random_mask

    return gta_either(base, experts, ctx, mergekit=random_mask, native=_dropped, consensus=True,
                      normalize_default=False)


def _dropped(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext, j: int) -> torch.Tensor:
    from mergepipe.core.operators.sparsify import dropped_into, scratch

    return dropped_into(delta, e.density, e.key, ctx.flat_offset,
                        str(ctx.params.get("rescale", "density")), scratch.like(("w", j), delta))


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
