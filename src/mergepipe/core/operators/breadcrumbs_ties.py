"""breadcrumbs_ties: the breadcrumbs band of each expert delta, then the TIES sign election."""

from __future__ import annotations

from mergepipe.core.operators.breadcrumbs import (
    GAMMA,
    MERGEKIT_PARAMS,
    band_mask,
    band_native,
    cuts,
    no_rescale,
)
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec

# M = B + lambda * disjoint_sum_i(w_i band(D_i)) (normalize: disjoint mean)
breadcrumbs_ties = gta_kernel(band_mask, band_native, consensus=True, normalize_default=False)

SPEC = OperatorSpec(
    name="breadcrumbs_ties", title="Model Breadcrumbs with TIES",
    formula="M = B + lambda * disjoint_sum_i(w_i band(D_i; gamma, density_i))",
    kernel=breadcrumbs_ties, normalize_default=False, additive=False, density=True,
    params=(GAMMA,), cuts=cuts,
    # ranked by the regime rule, as dare_ties: l2 for peaked updates (the output is a disjoint
    # sum, so an unread block costs its kept, agreeing delta), per_tensor for flat ones; below
    # random plans of equal bytes in 43 of 50 cells of ten families (four held out; l2 alone:
    # 35) with the lowest mean KL at 0.3 / 0.5 (docs/FIDELITY.md, "The regime rule")
    default_utility="auto",
    not_incremental=("breadcrumbs_ties elects each entry's sign over all experts together: one "
                     "expert more can flip signs everywhere"),
    mergekit=MergekitMethod("breadcrumbs_ties", params=MERGEKIT_PARAMS, translate=no_rescale),
)
