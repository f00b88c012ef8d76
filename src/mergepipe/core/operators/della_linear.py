"""della_linear: della's magnitude-ranked keyed drop and L1 rescale, then a weighted sum."""

from __future__ import annotations

from mergepipe.core.operators.della import (
    EPSILON,
    MERGEKIT_PARAMS,
    RESCALE,
    check,
    magprune,
    magprune_native,
    rescale_from_mergekit,
)
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec

# M = B + lambda * sum_i w_i magprune(D_i) (normalize divides by sum_i w_i)
della_linear = gta_kernel(magprune, magprune_native, consensus=False, normalize_default=False)

SPEC = OperatorSpec(
    name="della_linear", title="DELLA (linear)",
    formula="M = B + lambda * sum_i w_i magprune(D_i; density_i, epsilon)",
    kernel=della_linear, normalize_default=False, additive=False, density=True,
    params=(EPSILON, RESCALE), check=check, min_ndim=1,  # magprune ranks within rows
    not_incremental=("the per-block L1 rescale and row ranks are computed with each merge; "
                     "extending a stored merge is not implemented for della"),
    mergekit=MergekitMethod("della_linear", params=MERGEKIT_PARAMS,
                            translate=rescale_from_mergekit),
)
