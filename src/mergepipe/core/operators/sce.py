"""sce: select the entries of largest variance, weight the experts by mean square, erase the
minority signs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


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


SPEC = OperatorSpec(
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
