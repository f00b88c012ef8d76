"""multislerp: barycentric spherical interpolation of several experts' deltas from the base."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def multislerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
               ) -> torch.Tensor:
    """mergekit 0.1.5's Multi-SLERP of the deltas (one expert: its own tensor); where every delta
    is zero the result is the base (mergekit refuses a zero mean of three or more)."""
    import torch

    dt = mk.compute_dtype(ctx)
    if len(experts) == 1:
        return mk.expert_value(base, experts[0], dt).float()
    b = base.to(dt)
    eps = float(ctx.params.get("eps", 1e-8))
    tensors = torch.stack([mk.expert_value(base, e, dt) for e in experts], dim=0)
    tensors -= b
    flat = tensors.view(tensors.shape[0], -1)
    weights = torch.tensor([e.weight for e in experts], dtype=tensors.dtype)
    if ctx.params.get("normalize_weights", True):
        weights = weights / weights.sum()
    norms = torch.norm(flat, dim=-1, keepdim=True)
    if not bool(norms.any()):  # every expert equal to the base here (or none read): the base
        return b.float()
    units = flat / (norms + eps)
    mean = (units * weights.view(-1, 1)).sum(0)
    mean_norm = torch.norm(mean)
    if mean_norm < eps:
        if tensors.shape[0] == 2:  # antipodal pair: linear interpolation
            res = (tensors[0] * weights[0] + tensors[1] * weights[1]).view(tensors.shape[1:])
            return (res + b).float()
        raise InvalidRequest(f"multislerp: the weighted sum of the experts' deltas of tensor "
                             f"{ctx.tensor!r} is zero (antipodal deltas whose weights cancel); "
                             "change the weights", field="experts")
    mean = mean / mean_norm
    dots = (units * mean).sum(-1, keepdim=True)
    tangent = ((units - dots * mean) * weights.view(-1, 1)).sum(0)
    tangent_norm = torch.norm(tangent) + eps
    result = mean * torch.cos(tangent_norm) + tangent * (torch.sin(tangent_norm) / tangent_norm)
    result = result * (norms.squeeze(-1) * weights).sum()
    return (result.view(tensors.shape[1:]) + b).float()


SPEC = OperatorSpec(
    name="multislerp", title="Multi-SLERP",
    formula="M = B + |D|_w exp_m(sum_i w_i log_m(D_i / |D_i|)), m the normalized weighted "
            "mean of the unit deltas",
    kernel=multislerp, normalize_default=False, additive=False,
    params=(Param("normalize_weights", bool, True, help="divide the weights by their sum"),
            Param("eps", float, 1e-8, optional=True, help="added to norms before dividing")),
    planning_unit="group",
    whole_tensor="the norms of the experts' deltas and their weighted mean direction",
    not_incremental="multislerp averages directions on the sphere, not a sum of deltas",
    mergekit=MergekitMethod("multislerp", params={"normalize_weights": "normalize_weights",
                                                  "eps": "eps"},
                            base_needed="mergekit's multislerp can interpolate models without "
                            "a base, MergePipe interpolates the deltas of experts from a base "
                            "(give the base they were fine-tuned from)"),
)
