"""arcee_fusion: the expert's change kept where its importance stands out in the tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


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


SPEC = OperatorSpec(
    name="arcee_fusion", title="Arcee Fusion",
    formula="M = B + (X - B) [importance >= median + 1.5 IQR], importance = |X - B| "
            "KL(softmax X || softmax B) per row",
    kernel=arcee_fusion, normalize_default=False, additive=False,
    experts_count=(1, 1), planning_unit="group",
    whole_tensor="the quartiles of every entry's importance in the tensor",
    not_incremental="arcee_fusion keeps the entries whose importance stands out in the tensor",
    mergekit=MergekitMethod("arcee_fusion", weights=False),
)
