"""nearswap: M = w X + (1 - w) B per entry, w = clamp(t / |X - B|, 0, 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def nearswap(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's NearSwap in the compute dtype (an unread block is the base)."""
    dt = mk.compute_dtype(ctx)
    a = base.to(dt)
    b = mk.expert_value(base, experts[0], dt)
    weight = (float(ctx.params["t"]) / (a - b).abs().clamp(min=1e-6)).clamp(min=0, max=1)
    return (weight * b + (1 - weight) * a).float()


SPEC = OperatorSpec(
    name="nearswap", title="NearSwap",
    formula="M = w X + (1 - w) B, w = clamp(t / |X - B|, 0, 1) per entry",
    kernel=nearswap, normalize_default=False, additive=False,
    params=(Param("t", float, 0.001, help="distance below which the expert's value is taken "
                  "as is; farther entries move toward the expert by t", bounds=(0.0, None)),),
    experts_count=(1, 1),
    not_incremental="nearswap's weight depends on the expert's distance to the base per entry",
    mergekit=MergekitMethod("nearswap", params={"t": "t"}, weights=False,
                            required={"t": "the distance threshold t"}),
)
