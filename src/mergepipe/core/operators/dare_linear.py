"""dare_linear: keyed random drop with rescale, then a weighted sum (the drop, the `rescale`
parameter and its mergekit form are dare_ties's too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.base import RESCALES
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.mergekit_arith import random_mask
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ReadExpert

RESCALE = Param("rescale", str, "density", RESCALES,
                "density: divide kept entries by density (the DARE paper); l1: match each "
                "block's L1 norm (mergekit); none: leave them")
MERGEKIT_PARAMS = {"normalize": "normalize", "lambda": "lambda", "rescale": "rescale"}


def rescale_from_mergekit(params: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """mergekit's boolean `rescale` (default true: L1 rescaling) -> our rescale choice."""
    key = "parameters.rescale"
    value = params.get("rescale")
    if value is None or value is True:
        notes.append("parameters.rescale: true (mergekit's default for DARE) -> rescale: l1, "
                     "kept entries rescaled to the dropped block's L1 norm")
        return {**params, "rescale": "l1"}
    if value is False:
        return {**params, "rescale": "none"}
    if value in RESCALES:
        return {**params, "rescale": str(value)}
    raise InvalidRequest(f"{key}: must be true, false, or one of {', '.join(RESCALES)}; got "
                         f"{value!r}", field=key)


def dropped(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext, j: int) -> torch.Tensor:
    from mergepipe.core.operators.sparsify import dropped_into, scratch

    return dropped_into(delta, e.density, e.key, ctx.flat_offset,
                        str(ctx.params.get("rescale", "density")), scratch.like(("w", j), delta))


# M = B + lambda * sum_i w_i DARE(D_i) (normalize divides by sum_i w_i)
dare_linear = gta_kernel(random_mask, dropped, consensus=False, normalize_default=False)

SPEC = OperatorSpec(
    name="dare_linear", title="DARE (linear)",
    formula="M = B + lambda * sum_i w_i drop(D_i, density_i) / rescale",
    kernel=dare_linear, normalize_default=False, additive=False, density=True,
    not_incremental=None,
    params=(RESCALE,),
    mergekit=MergekitMethod("dare_linear", params=MERGEKIT_PARAMS, translate=rescale_from_mergekit),
    fused=FusedKernel("linear", drop=True),
)
