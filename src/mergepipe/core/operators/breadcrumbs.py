"""breadcrumbs: drop each expert delta's largest gamma fraction (outliers) and
its smallest entries, keeping the density fraction in between (the catalog's band thresholds);
then a weighted sum (the band is breadcrumbs_ties's too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ReadExpert

GAMMA = Param("gamma", float, 0.01, help="fraction of each delta's largest |entries| dropped "
              "as outliers (mergekit's default 0.01)", bounds=(0.0, 1.0))
MERGEKIT_PARAMS = {"normalize": "normalize", "lambda": "lambda", "rescale": "rescale",
                   "gamma": "gamma"}


def cuts(numel: int, density: float, params: Mapping[str, Any]) -> tuple[int, int] | None:
    """(k_upper, k_lower): keep the magnitude ranks [k_upper, k_lower) (0 = the largest), as
    mergekit's magnitude_outliers keeps sorted positions [n_bot, n_bot + int(density * n)) in
    ascending order; None at density 1 (mergekit then keeps the delta whole, outliers too)."""
    if density >= 1:
        return None
    target = int(density * numel)
    top = int(float(params.get("gamma", GAMMA.default)) * numel)
    bottom = max(0, numel - target - top)
    return numel - bottom - target, numel - bottom


def band_mask(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
    """mergekit arithmetic: the band's mask (from the float32 delta) applied in the compute dtype."""
    from mergepipe.core.operators.sparsify import scratch

    kept = band_into(e, scratch.like("mk-band", e.delta), ctx.flat_offset)
    return delta * (kept != 0)


def band_native(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext, j: int
                ) -> torch.Tensor:
    from mergepipe.core.operators.sparsify import scratch
    return band_into(e, scratch.like(("w", j), delta), ctx.flat_offset)


def band_into(e: ReadExpert, out: torch.Tensor, flat_offset: int) -> torch.Tensor:
    """out = the entries of e.delta between the two cuts (others zero). Both cuts use the
    expert's keyed rule at a tied threshold, so the upper cut's kept set is inside the lower's."""
    import numpy as np

    from mergepipe.core.operators.sparsify import flat, scratch, trimmed_into

    trimmed_into(e.delta, e.trim, e.key, flat_offset, out)
    upper = getattr(e.trim, "upper", None)
    if upper is not None:
        top = trimmed_into(e.delta, upper, e.key, flat_offset, scratch.like("band-top", out))
        keep = scratch.like("band-keep", out)
        np.equal(flat(top), np.float32(0), out=flat(keep), casting="unsafe")
        out.mul_(keep)
    return out


def no_rescale(params: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """mergekit's `rescale` (default false for breadcrumbs): true is refused."""
    params = dict(params)
    if params.pop("rescale", None) not in (None, False):
        raise InvalidRequest("parameters.rescale: breadcrumbs with rescale: true (the band "
                             "rescaled to the whole tensor's L1 norm) is not supported; remove "
                             "it", field="parameters.rescale")
    return params


# M = B + lambda * sum_i w_i band(D_i) (normalize divides by sum_i w_i)
breadcrumbs = gta_kernel(band_mask, band_native, consensus=False, normalize_default=False)

SPEC = OperatorSpec(
    name="breadcrumbs", title="Model Breadcrumbs",
    formula="M = B + lambda * sum_i w_i band(D_i; gamma, density_i)",
    kernel=breadcrumbs, normalize_default=False, additive=True, density=True,
    params=(GAMMA,), cuts=cuts,
    not_incremental=("the band thresholds are planned with each merge; extending a stored merge "
                     "is not implemented for band operators"),
    mergekit=MergekitMethod("breadcrumbs", params=MERGEKIT_PARAMS, translate=no_rescale),
)
