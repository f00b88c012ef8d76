"""slerp: spherical interpolation from the base (t=0) to one expert (t=1), per whole tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.geometry import slerp_pair
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def slerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """From the base (t=0) to the one expert (t=1); the norms, the dot product and the
    interpolation run in float32 (float64 inputs: float64) as in mergekit 0.1.5."""
    dt = mk.compute_dtype(ctx)
    v0 = base.to(dt)
    v1 = mk.expert_value(base, experts[0], dt)
    return slerp_pair(float(ctx.params.get("t", 0.5)), v0, v1).float()


SPEC = OperatorSpec(
    name="slerp", title="SLERP (spherical interpolation)",
    formula="M = sin((1-t) theta)/sin(theta) B + sin(t theta)/sin(theta) X, "
            "cos theta = <B/|B|, X/|X|> per tensor",
    kernel=slerp, normalize_default=False, additive=False,
    params=(Param("t", float, 0.5, help="interpolation factor: 0 the base, 1 the expert"),),
    planning_unit="group", experts_count=(1, 1),
    whole_tensor="the norms of the base and expert tensors and the dot product of their "
                 "normalized copies",
    not_incremental="slerp interpolates between whole tensors, not a sum of per-expert terms",
    mergekit=MergekitMethod("slerp", params={"t": "t"}, weights=False, required={
        "t": "the interpolation factor t (0: the base, 1: the other model)"}),
)
