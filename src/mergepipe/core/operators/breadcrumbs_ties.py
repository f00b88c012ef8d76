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
    # l2 (the spec default): the output is a disjoint sum, so an unread block costs its kept,
    # agreeing delta, as for dare_ties; per_tensor (its previous default) lost 9 of 25 cells
    # against random plans, l2 3 (all at budget 0.1) (docs/FIDELITY.md, "Default rankings")
    not_incremental=("breadcrumbs_ties elects each entry's sign over all experts together: one "
                     "expert more can flip signs everywhere"),
    mergekit=MergekitMethod("breadcrumbs_ties", params=MERGEKIT_PARAMS, translate=no_rescale),
)
