"""linear (aliases avg, average): M = B + lambda * sum_i (w_i / sum_j w_j) D_i."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mergepipe.core.operators.gta_native import weighted_sum
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def linear(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.linear(base, experts, ctx)
    return weighted_sum(base, experts, ctx, normalize_default=True)


def _renormalized(params: Mapping[str, Any]) -> str | None:
    if params.get("renormalize") == "selected":
        return "no bound: renormalize=selected changes the coefficients with the access set"
    return None


SPEC = OperatorSpec(
    name="linear", title="linear (weighted average)",
    formula="M = B + lambda * sum_i (w_i / sum_j w_j) D_i",
    kernel=linear, normalize_default=True, additive=True,
    # per_tensor in both regimes: below random plans of equal bytes in all 55 cells of eleven
    # families (docs/FIDELITY.md, "The regime rule")
    default_utility="per_tensor", auto_utility=("per_tensor", "per_tensor"),
    not_incremental=None,
    params=(Param("renormalize", str, "fixed", ("fixed", "selected"),
                  "selected: divide by the weights of the experts read for each block"),),
    aliases=("avg", "average"),
    mergekit=MergekitMethod("linear", params={"normalize": "normalize"},
                            base_in_average=True),
    bound_exception=_renormalized,
    fused=FusedKernel("linear"),
)
