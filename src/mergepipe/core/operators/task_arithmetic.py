"""task_arithmetic: M = B + lambda * sum_i w_i D_i (normalize divides by sum_i w_i)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.gta_native import weighted_sum
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def task_arithmetic(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
                    ) -> torch.Tensor:
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.gta(base, experts, ctx, sparsify=None, consensus=False, normalize_default=False)
    return weighted_sum(base, experts, ctx, normalize_default=False)


SPEC = OperatorSpec(
    name="task_arithmetic", title="task arithmetic",
    formula="M = B + lambda * sum_i w_i D_i",
    kernel=task_arithmetic, normalize_default=False, additive=True,
    # ranked by the regime rule: per_tensor (the summed share of each (expert, tensor) delta
    # kept) for flat updates, else tensor_energy (a quadratic model of a sum's output
    # change); below random plans of equal bytes in 52 of 55 cells of eleven families (four
    # held out), with the lowest mean KL at 0.3 / 0.5 (docs/FIDELITY.md, "The regime rule")
    default_utility="auto", auto_utility=("per_tensor", "tensor_energy"),
    not_incremental=None,
    mergekit=MergekitMethod("task_arithmetic", params={"normalize": "normalize",
                                                       "lambda": "lambda", "rescale": None}),
    fused=FusedKernel("linear"),
)
