"""karcher: the Karcher (Riemannian) mean of the experts and the base on the unit sphere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.geometry import karcher_mean
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def karcher(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's Karcher mean of the experts' tensors (not deltas) and then the base
    (mergekit counts base_model as one more point), with equal weights."""
    dt = mk.compute_dtype(ctx)
    tensors = [*(mk.expert_value(base, e, dt) for e in experts), base.to(dt)]
    alphas = [1.0 / len(tensors)] * len(tensors)
    return karcher_mean(tensors, alphas, int(ctx.params.get("max_iter", 10)),
                        float(ctx.params.get("tol", 1e-5))).float()


SPEC = OperatorSpec(
    name="karcher", title="Karcher mean",
    formula="M = mean |Y| argmin_m sum_Y d(m, Y / |Y|)^2 on the unit sphere, Y over the "
            "experts and the base",
    kernel=karcher, normalize_default=False, additive=False,
    params=(Param("max_iter", float, 10.0, help="Riemannian gradient steps at most"),
            Param("tol", float, 1e-5, help="stop when the step's norm is below it")),
    planning_unit="group",
    whole_tensor="the norms of the experts' and the base's tensors and the angles between them",
    not_incremental="the Karcher mean is found by iterating over all experts' directions",
    mergekit=MergekitMethod("karcher", params={"max_iter": "max_iter", "tol": "tol"},
                            weights=False,
                            base_needed="mergekit's karcher can average models without a base, "
                            "MergePipe merges experts with the base they were fine-tuned from "
                            "(the base is one of the averaged points)"),
)
