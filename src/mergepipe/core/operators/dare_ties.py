"""dare_ties: keyed random drop with rescale (dare_linear's), then the TIES sign election."""

from __future__ import annotations

from mergepipe.core.operators.dare_linear import (
    MERGEKIT_PARAMS,
    RESCALE,
    dropped,
    rescale_from_mergekit,
)
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.mergekit_arith import random_mask
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec

# DARE drop and rescale per expert, then the TIES election (normalize default false)
dare_ties = gta_kernel(random_mask, dropped, consensus=True, normalize_default=False)

SPEC = OperatorSpec(
    name="dare_ties", title="DARE-TIES",
    formula="M = B + lambda * disjoint_sum_i(w_i drop(D_i, density_i) / rescale)",
    kernel=dare_ties, normalize_default=False, additive=False, density=True,
    # (expert, block) units ranked by the regime rule: l2 for peaked updates (the output is a
    # disjoint *sum*, so an unread block costs its expert's kept, agreeing delta there, whose
    # expected norm ||D_b|| / sqrt(density) has the l2 order), per_tensor for flat ones, where
    # block norms say little; below random plans of equal bytes in 49 of 55 cells of eleven
    # families (four held out; l2 alone: 38), with the lowest mean KL at 0.3 / 0.5
    # (docs/FIDELITY.md, "The regime rule")
    default_utility="auto", auto_utility=("per_tensor", "l2"),
    not_incremental="DARE-TIES elects each entry's sign over all experts together: one expert more "
                    "can flip signs everywhere",
    params=(RESCALE,),
    mergekit=MergekitMethod("dare_ties", params=MERGEKIT_PARAMS, translate=rescale_from_mergekit),
    fused=FusedKernel("ties", drop=True),
)
