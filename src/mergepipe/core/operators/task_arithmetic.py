"""task_arithmetic: M = B + lambda * sum_i w_i D_i (normalize divides by sum_i w_i)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.base import read_experts
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def task_arithmetic(base: torch.Tensor, experts: list[ExpertBlock],
                    ctx: BlockContext) -> torch.Tensor:
    """Scaled sum of task vectors; omitted blocks add nothing, coefficients stay fixed."""
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.gta(base, experts, ctx, sparsify=None, consensus=False, normalize_default=False)
    import torch

    from mergepipe.core.operators.sparsify import finish_into, weight_total, weighted_sum_into

    read = read_experts(experts)
    if not read:
        return base.clone()
    mixed = weighted_sum_into([e.delta for e in read],
                              [e.weight for e in read], torch.empty_like(base))
    divisor = weight_total(ctx.all_weights) if ctx.normalize(False) else None
    return finish_into(mixed, base, ctx.lam, divisor)


SPEC = OperatorSpec(
    name="task_arithmetic", title="task arithmetic",
    formula="M = B + lambda * sum_i w_i D_i",
    kernel=task_arithmetic, normalize_default=False, additive=True,
    default_utility="per_tensor",  # measured: below random plans (docs/FIDELITY.md)
    not_incremental=None,
    mergekit=MergekitMethod("task_arithmetic", params={"normalize": "normalize",
                                                       "lambda": "lambda", "rescale": None}),
    fused=FusedKernel("linear"),
)
