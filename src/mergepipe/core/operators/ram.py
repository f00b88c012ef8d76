"""ram and ramplus_tl: Reinforced Agent Merging (arXiv 2601.13572): entries one expert changed keep
its delta, shared entries average the deltas of the experts that changed them; RAM+ scales each
expert's unique entries up by how much it overlaps the others in the tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from mergepipe.core.errors import InvalidRequest
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

    from mergepipe.core.operators import mergekit_arith as mk

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


def check_epsilon(params: Any, densities: Any) -> None:
    if float(params.get("epsilon", 1e-5)) < 0:
        raise InvalidRequest("params.epsilon: the change threshold must be >= 0",
                             field="params.epsilon")


EPSILON = Param("epsilon", float, 1e-5, help="a delta entry counts as a change above it")

RAM = OperatorSpec(
    name="ram", title="RAM (Reinforced Agent Merging)",
    formula="M = B + sum over experts that changed an entry of D_i / (how many did)",
    kernel=ram, normalize_default=False, additive=False, params=(EPSILON,),
    planning_unit="group", check=check_epsilon,
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


def _check(params: Any, densities: Any) -> None:
    check_epsilon(params, densities)
    for name in ("r", "alpha"):
        if float(params.get(name, 0.0)) < 0:
            raise InvalidRequest(f"params.{name} must be >= 0", field=f"params.{name}")


RAMPLUS_TL = OperatorSpec(
    name="ramplus_tl", title="RAM+ (tensor-local)",
    formula="RAM with expert i's unique entries scaled by 1 + r clamp(shared_i / unique_i, 0, "
            "alpha) over the tensor",
    kernel=ramplus_tl, normalize_default=False, additive=False,
    params=(Param("r", float, 0.1, help="how much overlap scales the unique entries"),
            Param("alpha", float, 0.2, help="cap of the overlap ratio"), EPSILON),
    planning_unit="group", check=_check,
    whole_tensor="each expert's counts of shared and unique changed entries in the tensor",
    not_incremental="RAM+ scales each expert by its overlap with all the others",
    mergekit=MergekitMethod("ramplus_tl", params={"r": "r", "alpha": "alpha",
                                                  "epsilon": "epsilon"}, weights=False),
)
