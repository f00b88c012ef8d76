"""slerp: M = sin((1-t) theta)/sin(theta) B + sin(t theta)/sin(theta) X over whole tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock

DOT_THRESHOLD = 0.9995  # |cos theta| above it: linear interpolation (mergekit's default)
EPS = 1e-8  # a norm at or below it counts as 1 (mergekit's eps)
CHUNK_ELEMENTS = 1024 * 1024  # mergekit's reduction chunks: the same sums in the same order


def slerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """Spherical interpolation from the base (t=0) to the one expert (t=1), on a whole tensor.

    The inputs are cast to the compute dtype; the norms, the dot product of the normalized
    tensors and the interpolation run in float32 (float64 inputs: float64) as in mergekit 0.1.5,
    the result is rounded to the compute dtype. An expert's unread blocks are the base's there.
    """
    from mergepipe.core.operators import mergekit_arith as mk

    dt = mk.compute_dtype(ctx)
    v0 = base.to(dt)
    v1 = mk.expert_value(base, experts[0], dt)
    return interpolate(float(ctx.params.get("t", 0.5)), v0, v1).float()


def interpolate(t: float, v0: torch.Tensor, v1: torch.Tensor) -> torch.Tensor:
    """mergekit 0.1.5's slerp of one tensor pair (its output axis of one), in v0's dtype."""
    import torch

    work = torch.float64 if v0.dtype == torch.float64 else torch.float32
    a, b = v0.reshape(1, -1), v1.reshape(1, -1)
    tt = torch.tensor([t], dtype=work).reshape(-1, 1)
    if not a.shape[1]:
        return ((1 - tt) * a + tt * b).reshape(v0.shape).to(v0.dtype)
    chunks = [slice(s, s + CHUNK_ELEMENTS) for s in range(0, a.shape[1], CHUNK_ELEMENTS)]
    norm_a = torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(a[:, c].to(work), dim=1, keepdim=True) for c in chunks]), dim=0)
    norm_b = torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(b[:, c].to(work), dim=1, keepdim=True) for c in chunks]), dim=0)
    norm_a = torch.where(norm_a > EPS, norm_a, 1)
    norm_b = torch.where(norm_b > EPS, norm_b, 1)
    dot = torch.stack([((a[:, c].to(work) / norm_a) * (b[:, c].to(work) / norm_b)).sum(
        dim=1, keepdim=True) for c in chunks]).sum(dim=0).clamp(-1, 1)
    linear = dot.abs() > DOT_THRESHOLD
    theta = torch.acos(torch.where(linear, 0, dot))
    sin_theta = torch.sin(theta)
    coef_a = torch.where(linear, 1 - tt, torch.sin((1 - tt) * theta) / sin_theta)
    coef_b = torch.where(linear, tt, torch.sin(tt * theta) / sin_theta)
    result = torch.empty_like(a)
    for c in chunks:
        result[:, c] = coef_a * a[:, c].to(work) + coef_b * b[:, c].to(work)
    return result.reshape(v0.shape)


def _translate(p: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    if "t" not in p:
        raise InvalidRequest("parameters.t: missing; mergekit's slerp requires the interpolation "
                             "factor t (0: the base, 1: the other model)", field="parameters.t")
    return p


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
    mergekit=MergekitMethod("slerp", params={"t": "t"}, weights=False, translate=_translate),
)
