"""karcher: the Karcher (Riemannian) mean of the experts and the base on the unit sphere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def karcher(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's Karcher mean of the tensors (not deltas) of the experts and then the
    base (mergekit counts base_model as one more point), equal weights, on a whole tensor: the
    directions are averaged by at most max_iter Riemannian gradient steps (stopping below tol),
    the result scaled by the mean norm. An unread block is the expert equal to the base there.
    """
    from mergepipe.core.operators import mergekit_arith as mk

    dt = mk.compute_dtype(ctx)
    tensors = [*(mk.expert_value(base, e, dt) for e in experts), base.to(dt)]
    alphas = [1.0 / len(tensors)] * len(tensors)
    return mean(tensors, alphas, int(ctx.params.get("max_iter", 10)),
                float(ctx.params.get("tol", 1e-5))).float()


def mean(tensors: list[torch.Tensor], alphas: list[float], max_iter: int, tol: float
         ) -> torch.Tensor:
    """The weighted Karcher mean, in the same operations and order as mergekit 0.1.5."""
    import torch

    work = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    norms = [torch.linalg.vector_norm(t.to(work)) for t in tensors]
    units = [torch.zeros_like(t) if n.item() == 0.0 else (t / n).to(t.dtype)
             for t, n in zip(tensors, norms, strict=True)]
    valid = [i for i, n in enumerate(norms) if n.item() > tol]
    if not valid:
        return sum((t * 0 for t in tensors), torch.zeros_like(tensors[0]))
    total = sum(alphas[i] for i in valid)
    weights = [alphas[i] / total for i in valid]
    points = [units[i] for i in valid]
    m = torch.zeros_like(points[0])
    for a, u in zip(weights, points, strict=True):
        m += a * u
    m_norm = torch.linalg.vector_norm(m.to(work))
    m = points[0].clone() if m_norm.item() < tol else (m / m_norm).to(m.dtype)
    for _ in range(max_iter):
        tangent = torch.zeros_like(m)
        for a, u in zip(weights, points, strict=True):
            dot = torch.clamp(torch.dot(m.flatten(), u.flatten()), -1.0, 1.0)
            theta = torch.arccos(dot)
            if theta.item() < tol:
                continue
            tangent += a * (theta / torch.sin(theta)) * (u - dot * m)
        t_norm = torch.linalg.vector_norm(tangent.to(work))
        if t_norm.item() < tol:
            break
        m = (torch.cos(t_norm) * m + torch.sin(t_norm) * (tangent / t_norm)).to(m.dtype)
        u_norm = torch.linalg.vector_norm(m.to(work))
        if u_norm.item() > tol:
            m = (m / u_norm).to(m.dtype)
    scale = sum(a * n for a, n in zip(alphas, norms, strict=True))
    return scale * m


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
