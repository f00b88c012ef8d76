"""linear (alias avg) and task_arithmetic: M = B + lambda * sum_i w_i D_i, divided by sum_j w_j
under normalize (linear's default)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mergepipe.core.operators.base import read_experts
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def weighted_sum(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext,
                 normalize_default: bool) -> torch.Tensor:
    """The float32 sum of the read experts' weighted deltas (omitted blocks add nothing); the
    divisor is fixed by all experts' weights, or with renormalize='selected' (linear) by those
    of the experts read for this block."""
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


def linear(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.linear(base, experts, ctx)
    return weighted_sum(base, experts, ctx, normalize_default=True)


def task_arithmetic(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
                    ) -> torch.Tensor:
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.gta(base, experts, ctx, sparsify=None, consensus=False, normalize_default=False)
    return weighted_sum(base, experts, ctx, normalize_default=False)


def _renormalized(params: Mapping[str, Any]) -> str | None:
    if params.get("renormalize") == "selected":
        return "no bound: renormalize=selected changes the coefficients with the access set"
    return None


LINEAR = OperatorSpec(
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
    bound_exception=_renormalized,
    fused=FusedKernel("linear"),
)
TASK_ARITHMETIC = OperatorSpec(
    name="task_arithmetic", title="task arithmetic",
    formula="M = B + lambda * sum_i w_i D_i",
    kernel=task_arithmetic, normalize_default=False, additive=True,
    default_utility="per_tensor",  # measured: below random plans (docs/FIDELITY.md)
    not_incremental=None,
    mergekit=MergekitMethod("task_arithmetic", params={"normalize": "normalize",
                                                       "lambda": "lambda", "rescale": None}),
    fused=FusedKernel("linear"),
)
