"""The geometry of whole tensors on the unit sphere, in the same operations and order as mergekit
0.1.5: the slerp and nuslerp of a tensor pair, the Karcher mean of several."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

# mergekit's eps: a norm at or below it counts as 1 (slerp); 1 - cos^2 at or below EPS^2: the
# deltas are colinear, lerp (nuslerp)
EPS = 1e-8
DOT_THRESHOLD = 0.9995  # |cos theta| above it: linear interpolation (mergekit's default)
CHUNK_ELEMENTS = 1024 * 1024  # mergekit's reduction chunks: the same sums in the same order


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
