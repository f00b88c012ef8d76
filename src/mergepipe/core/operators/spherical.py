"""Merges by the geometry of whole tensors (angles, the unit sphere), as mergekit 0.1.5 computes
them in the compute dtype: slerp, nuslerp, model_stock, multislerp and the Karcher mean. An
expert's unread blocks are the base's there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock

# mergekit's eps: a norm at or below it counts as 1 (slerp); 1 - cos^2 at or below EPS^2: the
# deltas are colinear, lerp (nuslerp)
EPS = 1e-8
DOT_THRESHOLD = 0.9995  # |cos theta| above it: linear interpolation (mergekit's default)
CHUNK_ELEMENTS = 1024 * 1024  # mergekit's reduction chunks: the same sums in the same order


def slerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """From the base (t=0) to the one expert (t=1); the norms, the dot product and the
    interpolation run in float32 (float64 inputs: float64) as in mergekit 0.1.5."""
    dt = mk.compute_dtype(ctx)
    v0 = base.to(dt)
    v1 = mk.expert_value(base, experts[0], dt)
    return slerp_pair(float(ctx.params.get("t", 0.5)), v0, v1).float()


def slerp_pair(t: float, v0: torch.Tensor, v1: torch.Tensor) -> torch.Tensor:
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


SLERP = OperatorSpec(
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


def nuslerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """M = B + slerp(w_1 / (w_0 + w_1), X_0 - B, X_1 - B), the deltas normalized per row of the
    last dimension (`flatten: false`), per column (`row_wise`) or over the whole tensor."""
    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    x0, x1 = (mk.expert_value(base, e, dt) for e in experts)
    total = experts[0].weight + experts[1].weight
    t = 0.5 if abs(total) < 1e-6 else experts[1].weight / total
    row_wise = bool(ctx.params.get("row_wise", False))
    flatten = bool(ctx.params.get("flatten", True))
    return (b + nuslerp_pair(t, x0 - b, x1 - b, dim=0 if row_wise else -1, flatten=flatten)
            ).float()


def nuslerp_pair(t: float, v0: torch.Tensor, v1: torch.Tensor, *, dim: int, flatten: bool
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


NUSLERP = OperatorSpec(
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


def model_stock(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
                ) -> torch.Tensor:
    """Model Stock (arXiv 2403.19522) as mergekit 0.1.5 computes it, in the compute dtype: cos per
    row with `filter_wise`, t = 0 where its denominator vanishes; unread blocks are the base's."""
    import torch

    dt = mk.compute_dtype(ctx)
    w_0 = base.to(dt)
    ws = [mk.expert_value(base, e, dt) for e in experts]
    out_shape = w_0.shape
    if ctx.params.get("filter_wise", False):
        if w_0.dim() == 1:
            w_0, ws = w_0.unsqueeze(0), [w.unsqueeze(0) for w in ws]
    else:
        w_0, ws = w_0.reshape(-1), [w.reshape(-1) for w in ws]
    offsets = [w - w_0 for w in ws]
    cos_thetas = []
    for i, a in enumerate(offsets):
        for b in offsets[i + 1:]:
            norm_product = torch.norm(a, dim=-1) * torch.norm(b, dim=-1)
            cos_thetas.append(((a * b).sum(dim=-1) / norm_product.clamp(min=1e-6)).clamp(-1, 1))
    cos_theta = torch.stack(cos_thetas).mean(dim=0).unsqueeze(-1)
    count = len(ws)
    denominator = 1 + (count - 1) * cos_theta
    singular = denominator.abs() < 1e-6
    safe = torch.where(singular, torch.ones_like(denominator), denominator)
    t = torch.where(singular, torch.zeros_like(cos_theta), (count * cos_theta) / safe)
    average = sum(ws) / count
    return (t * average + (1 - t) * w_0).reshape(out_shape).float()


MODEL_STOCK = OperatorSpec(
    name="model_stock", title="Model Stock",
    formula="M = t mean_i X_i + (1 - t) B, t = k cos / (1 + (k - 1) cos), cos the mean "
            "pairwise cosine of the deltas",
    kernel=model_stock, normalize_default=False, additive=False,
    params=(Param("filter_wise", bool, False, help="one angle per row (filter) instead of one "
                  "per tensor"),),
    aliases=("modelstock",),
    planning_unit="group", experts_count=(2, None),
    whole_tensor="the norms of the experts' deltas and their pairwise dot products",
    not_incremental="model_stock weights the average by the angle between all experts' deltas",
    mergekit=MergekitMethod("model_stock", params={"filter_wise": "filter_wise"}, weights=False),
)


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


MULTISLERP = OperatorSpec(
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


def karcher(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's Karcher mean of the experts' tensors (not deltas) and then the base
    (mergekit counts base_model as one more point), with equal weights."""
    dt = mk.compute_dtype(ctx)
    tensors = [*(mk.expert_value(base, e, dt) for e in experts), base.to(dt)]
    alphas = [1.0 / len(tensors)] * len(tensors)
    return karcher_mean(tensors, alphas, int(ctx.params.get("max_iter", 10)),
                float(ctx.params.get("tol", 1e-5))).float()


def karcher_mean(tensors: list[torch.Tensor], alphas: list[float], max_iter: int, tol: float
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


KARCHER = OperatorSpec(
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
