"""nearswap: take the expert's value where it is near the base's, interpolate elsewhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def nearswap(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's NearSwap in the compute dtype (an unread block is the base)."""
    from mergepipe.core.operators import mergekit_arith as mk

    dt = mk.compute_dtype(ctx)
    a = base.to(dt)
    b = mk.expert_value(base, experts[0], dt)
    weight = (float(ctx.params["t"]) / (a - b).abs().clamp(min=1e-6)).clamp(min=0, max=1)
    return (weight * b + (1 - weight) * a).float()


def _check(params: Any, densities: Any) -> None:
    if float(params["t"]) < 0:
        raise InvalidRequest("params.t: nearswap's distance threshold t must be >= 0",
                             field="params.t")


def _translate(p: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    if "t" not in p:
        raise InvalidRequest("parameters.t: missing; mergekit's nearswap requires the distance "
                             "threshold t", field="parameters.t")
    return p


NEARSWAP = OperatorSpec(
    name="nearswap", title="NearSwap",
    formula="M = w X + (1 - w) B, w = clamp(t / |X - B|, 0, 1) per entry",
    kernel=nearswap, normalize_default=False, additive=False,
    params=(Param("t", float, 0.001, help="distance below which the expert's value is taken "
                  "as is; farther entries move toward the expert by t"),),
    experts_count=(1, 1), check=_check,
    not_incremental="nearswap's weight depends on the expert's distance to the base per entry",
    mergekit=MergekitMethod("nearswap", params={"t": "t"}, weights=False, translate=_translate),
)
