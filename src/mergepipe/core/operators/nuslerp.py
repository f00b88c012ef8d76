"""nuslerp: spherical interpolation of two experts' deltas from the base, per row, per column
or over the whole tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators import mergekit_arith as mk
from mergepipe.core.operators.geometry import nuslerp_pair
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def nuslerp(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """M = B + slerp(w_1 / (w_0 + w_1), X_0 - B, X_1 - B), the deltas normalized per row of the
    last dimension (`flatten: false`), per column (`row_wise`) or over the whole tensor."""
    dt = mk.compute_dtype(ctx)
    b = base.to(dt)
    x0, x1 = (mk.expert_value(base, e, dt) for e in experts)
    total = experts[0].weight + experts[1].weight
    t = 0.5 if abs(total) < 1e-6 else experts[1].weight / total
    row_wise = bool(ctx.params.get("row_wise", False))
    flatten = bool(ctx.params.get("flatten", True))
    return (b + nuslerp_pair(t, x0 - b, x1 - b, dim=0 if row_wise else -1, flatten=flatten)
            ).float()


SPEC = OperatorSpec(
    name="nuslerp", title="NuSLERP (spherical interpolation of two task vectors)",
    formula="M = B + slerp(w_1 / (w_0 + w_1), D_0, D_1), per row, per column or per tensor",
    kernel=nuslerp, normalize_default=False, additive=False,
    params=(Param("row_wise", bool, False, help="normalize per column (mergekit's row_wise: "
                  "dim 0) instead of per row of the last dimension"),
            Param("flatten", bool, True, help="normalize over the whole flattened tensor")),
    planning_unit="group", experts_count=(2, 2),
    whole_tensor="the norms of both experts' deltas and their cosine, per row, per column or "
                 "over the tensor",
    not_incremental="nuslerp interpolates between two whole deltas on the sphere",
    mergekit=MergekitMethod("nuslerp", params={"nuslerp_row_wise": "row_wise",
                                               "nuslerp_flatten": "flatten"},
                            base_needed="mergekit's nuslerp can interpolate two models "
                            "without a base, MergePipe merges the deltas of experts from a base "
                            "(give the base both models were fine-tuned from)"),
)
