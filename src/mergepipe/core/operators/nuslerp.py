"""nuslerp: spherical interpolation of two experts' deltas from the base, row-wise or flattened."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock

EPS = 1e-8  # 1 - cos^2 at or below EPS^2: the deltas are colinear, lerp (mergekit's eps)


def nuslerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """M = B + slerp(t, X_0 - B, X_1 - B) with t = w_1 / (w_0 + w_1), on a whole tensor.

    mergekit 0.1.5's operations in the compute dtype: the deltas are normalized per row of the
    last dimension (`nuslerp_flatten: false`), per column (`nuslerp_row_wise: true`) or over the
    whole flattened tensor (the default). An expert's unread blocks are the base's there.
    """
    from mergepipe.core.operators import mergekit_arith as mk

    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    x0, x1 = (mk.expert_value(base, e, dt) for e in experts)
    total = experts[0].weight + experts[1].weight
    t = 0.5 if abs(total) < 1e-6 else experts[1].weight / total
    row_wise = bool(ctx.params.get("row_wise", False))
    flatten = bool(ctx.params.get("flatten", True))
    return (b + interpolate(t, x0 - b, x1 - b, dim=0 if row_wise else -1, flatten=flatten)
            ).float()


def interpolate(t: float, v0: torch.Tensor, v1: torch.Tensor, *, dim: int, flatten: bool
                ) -> torch.Tensor:
    """mergekit 0.1.5's nuslerp of one tensor pair."""
    import torch

    out_shape = v0.shape
    if flatten:
        v0, v1 = v0.reshape(-1), v1.reshape(-1)
    elif dim != -1:
        v0, v1 = v0.transpose(dim, -1), v1.transpose(dim, -1)
    v0_u = v0 / torch.norm(v0, dim=-1, keepdim=True).clamp(min=1e-7)
    v1_u = v1 / torch.norm(v1, dim=-1, keepdim=True).clamp(min=1e-7)
    cos_theta = torch.sum(v0_u * v1_u, dim=-1, keepdim=True).clamp(-1, 1)
    colinear = (1 - cos_theta.square()) <= EPS**2
    theta = torch.acos(torch.where(colinear, 0, cos_theta))
    sin_theta = torch.sin(theta)
    result = (torch.sin((1 - t) * theta) * v0 + torch.sin(t * theta) * v1) / sin_theta
    result = torch.where(colinear, (1 - t) * v0 + t * v1, result)
    if dim != -1 and not flatten:
        result = result.transpose(dim, -1)
    return result.reshape(out_shape)


SPEC = OperatorSpec(
    name="nuslerp", title="NuSLERP (spherical interpolation of two task vectors)",
    formula="M = B + slerp(w_1 / (w_0 + w_1), D_0, D_1), per row, per column or per tensor",
    kernel=nuslerp, normalize_default=False, additive=False,
    params=(Param("row_wise", bool, False, help="normalize per column (mergekit's row_wise: "
                  "dim 0) instead of per row of the last dimension"),
            Param("flatten", bool, True, help="normalize over the whole flattened tensor")),
    planning_unit="group", experts_count=(2, 2),
    whole_tensor="the norms of both experts' deltas and their cosine, per row, per column or "
                 "over the tensor",
    not_incremental="nuslerp interpolates between two whole deltas on the sphere",
    mergekit=MergekitMethod("nuslerp", params={"nuslerp_row_wise": "row_wise",
                                               "nuslerp_flatten": "flatten"},
                            base_needed="mergekit's nuslerp can interpolate two models "
                            "without a base, MergePipe merges the deltas of experts from a base "
                            "(give the base both models were fine-tuned from)"),
)
