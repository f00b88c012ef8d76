"""ram: Reinforced Agent Merging: entries one expert changed keep its delta, shared entries
average the deltas of the experts that changed them (arXiv 2601.13572)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


class Contributions(NamedTuple):
    """Who changed each entry: the deltas (flattened), |delta| > epsilon, how many experts
    changed the entry, and whether more than one or exactly one did."""

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

    from mergepipe.core.operators import mergekit_arith as mk

    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    deltas = torch.stack([mk.expert_value(base, e, dt) - b for e in experts], dim=0)
    flat = deltas.view(len(experts), -1)
    nonzero = flat.abs() > float(ctx.params.get("epsilon", 1e-5))
    counts = nonzero.sum(dim=0, keepdim=True)
    return b, Contributions(flat, nonzero, counts, counts > 1, counts == 1)


def ram(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """M = B + sum_i D_i [only i changed it] + sum_i D_i / n [n > 1 experts changed it], per
    entry: block by block."""
    b, c = contributions(base, experts, ctx)
    z = c.deltas * c.nonzero
    merged = ((z * c.unique) + (z * c.overlap / c.counts.clamp(min=1))).sum(dim=0, keepdim=True)
    return (b + merged.reshape_as(b)).float()


def check_epsilon(params: Any, densities: Any) -> None:
    if float(params.get("epsilon", 1e-5)) < 0:
        raise InvalidRequest("params.epsilon: the change threshold must be >= 0",
                             field="params.epsilon")


EPSILON = Param("epsilon", float, 1e-5, help="a delta entry counts as a change above it")

SPEC = OperatorSpec(
    name="ram", title="RAM (Reinforced Agent Merging)",
    formula="M = B + sum over experts that changed an entry of D_i / (how many did)",
    kernel=ram, normalize_default=False, additive=False, params=(EPSILON,),
    planning_unit="group", check=check_epsilon,
    not_incremental="RAM divides each entry by how many experts changed it",
    mergekit=MergekitMethod("ram", params={"epsilon": "epsilon"}, weights=False),
)
