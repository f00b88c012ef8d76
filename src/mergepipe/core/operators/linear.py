"""linear (alias avg): M = B + lambda * sum_i alpha_i D_i, alpha_i = w_i / sum_j w_j (normalize)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mergepipe.core.operators.base import read_experts
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def linear(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """Weighted average of the experts' deltas on the base; omitted blocks add nothing.

    The coefficients are fixed by all experts' weights; with renormalize='selected' the
    divisor is the sum of the weights of the experts read for this block instead.
    """
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.linear(base, experts, ctx)
    import torch

    from mergepipe.core.operators.sparsify import finish_into, weight_total, weighted_sum_into

    read = read_experts(experts)
    if not read:
        return base.clone()
    mixed = weighted_sum_into([e.delta for e in read],
                              [e.weight for e in read], torch.empty_like(base))
    divisor = None
    if ctx.normalize(True):
        selected = ctx.params.get("renormalize", "fixed") == "selected"
        divisor = weight_total([e.weight for e in read] if selected else ctx.all_weights)
    return finish_into(mixed, base, ctx.lam, divisor)


def _coefficients(weights: Sequence[float], params: Mapping[str, Any]) -> list[float]:
    """alpha_i: lambda * w_i, divided by the weights' sum (the base's own weight included when
    mergekit's linear averages the base in) under normalize."""
    lam = float(params.get("lambda", 1.0))
    if params.get("normalize"):
        total = sum(weights) + float(params.get("base_weight", 0.0))
        return [lam * w / total for w in weights]
    return [lam * w for w in weights]


def _renormalized(params: Mapping[str, Any]) -> str | None:
    if params.get("renormalize") == "selected":
        return "no bound: renormalize=selected changes the coefficients with the access set"
    return None


SPEC = OperatorSpec(
    name="linear", title="linear (weighted average)",
    formula="M = B + lambda * sum_i (w_i / sum_j w_j) D_i",
    kernel=linear, normalize_default=True, additive=True,
    default_utility="per_tensor",  # measured: below random plans (docs/FIDELITY.md)
    not_incremental=None,
    params=(Param("renormalize", str, "fixed", ("fixed", "selected"),
                  "selected: divide by the weights of the experts read for each block"),),
    aliases=("avg", "average"),
    mergekit=MergekitMethod("linear", params={"normalize": "normalize"},
                            base_in_average=True),
    bound_exception=_renormalized, coefficients=_coefficients,
    fused=FusedKernel("linear"),
)
