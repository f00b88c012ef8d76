"""della: magnitude-ranked keyed drop (probabilities density +- epsilon by rank within each row,
mergekit's della_magprune), L1 rescale, then the TIES election (della_linear shares all but the
election)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ReadExpert

EPSILON = Param("epsilon", float, 0.15, help="spread of the keep probabilities: density - "
                "epsilon for the smallest |entry| of a row to density + epsilon for the largest")
RESCALE = Param("rescale", str, "l1", ("l1", "none"),
                "l1: rescale each pruned block to the L1 norm it had (mergekit's default); none")
MERGEKIT_PARAMS = {"normalize": "normalize", "lambda": "lambda", "rescale": "rescale",
                   "epsilon": "epsilon"}


def check(params: Mapping[str, Any], densities: Sequence[float]) -> None:
    """mergekit's own refusal: density +- epsilon must stay inside (0, 1) (below density 1)."""
    eps = float(params.get("epsilon", EPSILON.default))
    for d in densities:
        if d < 1 and (d + eps >= 1 or d - eps <= 0):
            raise InvalidRequest(f"params.epsilon {eps:g} with density {d:g}: density +- "
                                 "epsilon must be inside (0, 1) (mergekit refuses it too)",
                                 field="params.epsilon")


def rescale_from_mergekit(params: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """mergekit's boolean `rescale` (default true for della) -> l1 or none."""
    value = params.get("rescale")
    if value is None or value is True or value == "l1":
        return {**params, "rescale": "l1"}
    if value is False or value == "none":
        return {**params, "rescale": "none"}
    raise InvalidRequest(f"parameters.rescale: must be true or false; got {value!r}",
                         field="parameters.rescale")


def magprune(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
    """mergekit's della_magprune on one block, its dtypes and order, with keyed draws: rank
    |delta| within each row (stable order at ties), keep with probability
    (density - eps) + 2 eps (rank - 1) / (cols - 1), rescale to the block's L1 norm."""
    import torch

    from mergepipe.core.operators.keyed_hash import uniform
    from mergepipe.core.operators.mergekit_arith import l1_rescaled

    d = e.density
    if d >= 1:
        return delta
    eps = float(ctx.params.get("epsilon", EPSILON.default))
    work = delta.dtype if delta.dtype == torch.bfloat16 else torch.float32
    t = delta if delta.dim() >= 2 else delta.unsqueeze(0)
    order = torch.argsort(t.abs(), dim=1, stable=True)
    ranks = order.argsort(dim=1).to(work) + 1
    lo, hi = ranks.min(dim=1, keepdim=True).values, ranks.max(dim=1, keepdim=True).values
    rank_norm = ((ranks - lo) / (hi - lo)).clamp(0, 1)
    probs = (d - eps) + rank_norm * 2 * eps
    draw = uniform(e.key, ctx.flat_offset, t.shape)
    mask = (draw < probs.double()).to(work)
    x = t.to(work)
    masked = x * mask
    if str(ctx.params.get("rescale", "l1")) == "l1":
        masked = l1_rescaled(x, masked)
    return masked.to(delta.dtype).reshape(delta.shape)


def magprune_native(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext, j: int
                    ) -> torch.Tensor:
    return magprune(e, delta, ctx).clone() if e.density >= 1 else magprune(e, delta, ctx)


# M = B + lambda * disjoint_mean_i(w_i magprune(D_i))
della = gta_kernel(magprune, magprune_native, consensus=True, normalize_default=True)

SPEC = OperatorSpec(
    name="della", title="DELLA",
    formula="M = B + lambda * disjoint_mean_i(w_i magprune(D_i; density_i, epsilon))",
    kernel=della, normalize_default=True, additive=False, density=True,
    params=(EPSILON, RESCALE), check=check, min_ndim=1,  # magprune ranks within rows
    # (expert, block) units ranked by the regime rule: per_tensor for flat updates, else
    # region_energy (the disjoint mean's output change); below random plans of equal bytes in
    # 50 of 55 cells of eleven families (four held out), with the lowest mean KL at 0.3 / 0.5
    # (docs/FIDELITY.md, "The regime rule")
    default_utility="auto", auto_utility=("per_tensor", "region_energy"),
    not_incremental=("della elects each entry's sign over all experts together: one expert more "
                     "can flip signs everywhere"),
    mergekit=MergekitMethod("della", params=MERGEKIT_PARAMS, translate=rescale_from_mergekit),
)
