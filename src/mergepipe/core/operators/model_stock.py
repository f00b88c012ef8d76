"""model_stock: M = t mean_i X_i + (1 - t) B, t from the mean angle between the experts' deltas."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


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


SPEC = OperatorSpec(
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
