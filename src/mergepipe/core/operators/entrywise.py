"""What ram and ramplus_tl share (Reinforced Agent Merging, arXiv 2601.13572): who changed each
entry of a tensor, as mergekit 0.1.5 computes it in the compute dtype, and the `epsilon` above
which a delta entry counts as a change. An unread block is a zero delta: it changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.spec import Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock

EPSILON = Param("epsilon", float, 1e-5, help="a delta entry counts as a change above it",
                bounds=(0.0, None))


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
