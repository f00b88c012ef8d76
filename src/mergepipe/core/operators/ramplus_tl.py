"""ramplus_tl: RAM with each expert's unique entries scaled up by how much it overlaps the
others in the tensor (RAM+, tensor-local; arXiv 2601.13572)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.entrywise import EPSILON, contributions
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


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


SPEC = OperatorSpec(
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
