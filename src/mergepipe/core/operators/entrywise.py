"""Per-entry rules as mergekit 0.1.5 computes them in the compute dtype: ram and ramplus_tl
(Reinforced Agent Merging, arXiv 2601.13572: entries one expert changed keep its delta, shared
entries average the deltas of the experts that changed them; RAM+ scales each expert's unique
entries by its overlap with the others), nearswap, arcee_fusion and sce. An unread block is the
expert equal to the base there (a zero delta)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock

class Contributions(NamedTuple):
    """Who changed each entry (|delta| > epsilon) and how many did."""

    deltas: torch.Tensor
    nonzero: torch.Tensor
    counts: torch.Tensor
    overlap: torch.Tensor
    unique: torch.Tensor


def contributions(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
                  ) -> tuple[torch.Tensor, Contributions]:
    """(the base in the compute dtype, the experts' contributions), as mergekit 0.1.5's RAM
    methods prepare them. An unread block is a zero delta: it contributes nothing."""
    import torch

    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    deltas = torch.stack([mk.expert_value(base, e, dt) - b for e in experts], dim=0)
    flat = deltas.view(len(experts), -1)
    nonzero = flat.abs() > float(ctx.params.get("epsilon", 1e-5))
    counts = nonzero.sum(dim=0, keepdim=True)
    return b, Contributions(flat, nonzero, counts, counts > 1, counts == 1)


def ram(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """M = B + sum_i D_i / (how many experts changed the entry), block by block."""
    b, c = contributions(base, experts, ctx)
    z = c.deltas * c.nonzero
    merged = ((z * c.unique) + (z * c.overlap / c.counts.clamp(min=1))).sum(dim=0, keepdim=True)
    return (b + merged.reshape_as(b)).float()


EPSILON = Param("epsilon", float, 1e-5, help="a delta entry counts as a change above it",
                bounds=(0.0, None))

RAM = OperatorSpec(
    name="ram", title="RAM (Reinforced Agent Merging)",
    formula="M = B + sum over experts that changed an entry of D_i / (how many did)",
    kernel=ram, normalize_default=False, additive=False, params=(EPSILON,),
    planning_unit="group",
    not_incremental="RAM divides each entry by how many experts changed it",
    mergekit=MergekitMethod("ram", params={"epsilon": "epsilon"}, weights=False),
)


def ramplus_tl(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
               ) -> torch.Tensor:
    """RAM with expert i's unique entries scaled as mergekit 0.1.5 does (in float32)."""
    b, c = contributions(base, experts, ctx)
    eps = float(ctx.params.get("epsilon", 1e-5))
    shared = (c.nonzero & c.overlap).sum(dim=1)
    unique = (c.nonzero & c.unique).sum(dim=1)
    rho = shared / unique.clamp(min=eps)
    lam = 1 + float(ctx.params.get("r", 0.1)) * rho.clamp(min=0,
                                                          max=float(ctx.params.get("alpha", 0.2)))
    z = c.deltas * c.nonzero
    merged = ((z * c.unique * lam.unsqueeze(-1))
              + (z * c.overlap / c.counts.clamp(min=1))).sum(dim=0, keepdim=True)
    return (b + merged.reshape_as(b)).float()


RAMPLUS_TL = OperatorSpec(
    name="ramplus_tl", title="RAM+ (tensor-local)",
    formula="RAM with expert i's unique entries scaled by 1 + r clamp(shared_i / unique_i, 0, "
            "alpha) over the tensor",
    kernel=ramplus_tl, normalize_default=False, additive=False,
    params=(Param("r", float, 0.1, help="how much overlap scales the unique entries",
                  bounds=(0.0, None)),
            Param("alpha", float, 0.2, help="cap of the overlap ratio", bounds=(0.0, None)),
            EPSILON),
    planning_unit="group",
    whole_tensor="each expert's counts of shared and unique changed entries in the tensor",
    not_incremental="RAM+ scales each expert by its overlap with all the others",
    mergekit=MergekitMethod("ramplus_tl", params={"r": "r", "alpha": "alpha",
                                                  "epsilon": "epsilon"}, weights=False),
)


def nearswap(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's NearSwap in the compute dtype (an unread block is the base)."""
    dt = mk.compute_dtype(ctx)
    a = base.to(dt)
    b = mk.expert_value(base, experts[0], dt)
    weight = (float(ctx.params["t"]) / (a - b).abs().clamp(min=1e-6)).clamp(min=0, max=1)
    return (weight * b + (1 - weight) * a).float()


NEARSWAP = OperatorSpec(
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


def arcee_fusion(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
                 ) -> torch.Tensor:
    """mergekit 0.1.5's Arcee Fusion on a whole tensor, in the compute dtype: importance =
    |X - B| times the KL divergence of softmax(X) from softmax(B) along the last axis; the
    expert's change is kept where importance >= median + 1.5 IQR of the tensor's importances.

    The quartiles are read from the sorted importances at index int(q (n - 1)); mergekit samples
    a million entries at random (its global generator) above that size, MergePipe always uses
    every entry, so tensors of more than 10^6 entries may differ from one mergekit run (which
    differs between its runs too). An unread block is the expert equal to the base there."""
    import torch
    import torch.nn.functional as F

    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    x = mk.expert_value(base, experts[0], dt)
    p = F.softmax(x, dim=-1) + 1e-8
    q = F.softmax(b, dim=-1) + 1e-8
    importance = (x - b).abs() * torch.sum(p * torch.log(p / q), dim=-1, keepdim=True)
    ordered, _ = torch.sort(importance.reshape(-1))
    at = (torch.tensor([0.25, 0.5, 0.75]) * (ordered.numel() - 1)).long()
    q1, median, q3 = ordered[at]
    mask = (importance >= median + 1.5 * (q3 - q1)).float()
    return (b + (x - b) * mask).float()


ARCEE_FUSION = OperatorSpec(
    name="arcee_fusion", title="Arcee Fusion",
    formula="M = B + (X - B) [importance >= median + 1.5 IQR], importance = |X - B| "
            "KL(softmax X || softmax B) per row",
    kernel=arcee_fusion, normalize_default=False, additive=False,
    experts_count=(1, 1), planning_unit="group",
    whole_tensor="the quartiles of every entry's importance in the tensor",
    not_incremental="arcee_fusion keeps the entries whose importance stands out in the tensor",
    mergekit=MergekitMethod("arcee_fusion", weights=False),
)


def sce(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """mergekit 0.1.5's SCE on a whole tensor, in the compute dtype (an unread block is a zero
    delta): select by variance, weight by mean square, erase the minority signs (0 counts as +)."""
    import torch

    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    tvs = torch.stack([mk.expert_value(base, e, dt) - b for e in experts], dim=0)
    topk = float(ctx.params.get("select_topk", 1.0))
    if topk < 1:
        tvs = tvs * _select(tvs, topk).unsqueeze(0)
    sign = tvs.sign()
    majority = (tvs.sum(dim=0) >= 0).to(dt) * 2 - 1
    erase = sign == majority
    weights = tvs.square().reshape(tvs.shape[0], -1).mean(dim=1)
    total = torch.sum(weights).item()
    weights = (torch.ones_like(weights) / weights.shape[0] if abs(total) < 1e-6
               else weights / total)
    while weights.dim() < tvs.dim():
        weights = weights.unsqueeze(-1)
    erased = weights * erase
    merged = (tvs * erased).sum(dim=0)
    return (b + merged / torch.sum(erased, dim=0).clamp(min=1e-6)).float()


def _select(tvs: torch.Tensor, density: float) -> torch.Tensor:
    """The mask of the int(nonzero * density) entries of largest variance across experts."""
    import torch

    if density <= 0:
        return torch.zeros_like(tvs[0])
    var = torch.var(tvs, dim=0, unbiased=False)
    k = int(torch.count_nonzero(var) * density)
    mask = torch.zeros_like(var)
    if k == 0:
        return mask
    _, indices = torch.topk(var.abs().view(-1), k=k, largest=True)
    mask.view(-1)[indices] = 1
    return mask


SCE = OperatorSpec(
    name="sce", title="SCE (select, calculate, erase)",
    formula="M = B + sum_i w_i m_i D_i / sum_i w_i m_i, w_i ~ mean(D_i^2), m_i the sign "
            "consensus, over the select_topk entries of largest variance",
    kernel=sce, normalize_default=False, additive=False,
    params=(Param("select_topk", float, 1.0, help="share of the entries of largest variance "
                  "across the experts kept (1: all)", bounds=(0.0, 1.0)),
            Param("int8_mask", bool, False, optional=True,
                  help="mergekit's mask storage; the result is the same")),
    planning_unit="group",
    whole_tensor="each expert's mean square delta and, with select_topk < 1, the variance "
                 "ranking of every entry",
    not_incremental="SCE weights every expert by its share of all experts' mean squares",
    mergekit=MergekitMethod("sce", params={"select_topk": "select_topk",
                                           "int8_mask": "int8_mask"}, weights=False),
)
