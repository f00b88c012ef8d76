"""breadcrumbs_ties: the breadcrumbs band of each expert delta, then the TIES sign election."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.breadcrumbs import (
    GAMMA,
    MERGEKIT_PARAMS,
    band_mask,
    band_native,
    cuts,
    no_rescale,
)
from mergepipe.core.operators.gta_native import gta_either
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec

if TYPE_CHECKING:
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def breadcrumbs_ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
                     ) -> torch.Tensor:
    """M = B + lambda * disjoint_sum_i(w_i band(D_i)) (normalize: disjoint mean)."""
    return gta_either(base, experts, ctx, mergekit=band_mask, native=band_native, consensus=True,
                      normalize_default=False)


SPEC = OperatorSpec(
    name="breadcrumbs_ties", title="Model Breadcrumbs with TIES",
    formula="M = B + lambda * disjoint_sum_i(w_i band(D_i; gamma, density_i))",
    kernel=breadcrumbs_ties, normalize_default=False, additive=False, density=True,
    params=(GAMMA,), cuts=cuts,
    default_utility="per_tensor",  # as ties
    not_incremental=("breadcrumbs_ties elects each entry's sign over all experts together: one "
                     "expert more can flip signs everywhere"),
    mergekit=MergekitMethod("breadcrumbs_ties", params=MERGEKIT_PARAMS, translate=no_rescale),
)
