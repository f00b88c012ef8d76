"""ram: Reinforced Agent Merging (arXiv 2601.13572): entries one expert changed keep its delta,
shared entries average the deltas of the experts that changed them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.entrywise import EPSILON, contributions
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def ram(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """M = B + sum_i D_i / (how many experts changed the entry), block by block."""
    b, c = contributions(base, experts, ctx)
    z = c.deltas * c.nonzero
    merged = ((z * c.unique) + (z * c.overlap / c.counts.clamp(min=1))).sum(dim=0, keepdim=True)
    return (b + merged.reshape_as(b)).float()


SPEC = OperatorSpec(
    name="ram", title="RAM (Reinforced Agent Merging)",
    formula="M = B + sum over experts that changed an entry of D_i / (how many did)",
    kernel=ram, normalize_default=False, additive=False, params=(EPSILON,),
    planning_unit="group",
    not_incremental="RAM divides each entry by how many experts changed it",
    mergekit=MergekitMethod("ram", params={"epsilon": "epsilon"}, weights=False),
)
