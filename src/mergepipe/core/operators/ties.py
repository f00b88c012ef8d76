"""ties: magnitude trim from the catalog threshold, sign election, disjoint (normalized) sum."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.gta_native import gta_kernel
from mergepipe.core.operators.mergekit_arith import magnitude
from mergepipe.core.operators.spec import FusedKernel, MergekitMethod, OperatorSpec, Param
from mergepipe.core.tensor_params import Setting, is_scalar

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ReadExpert


def _trimmed(e: ReadExpert, delta: torch.Tensor, ctx: BlockContext, j: int) -> torch.Tensor:
    """The catalog threshold's trim; entries tied at it are kept by the keyed rule."""
    from mergepipe.core.operators.sparsify import scratch, trimmed_into

    return trimmed_into(delta, e.trim, e.key, ctx.flat_offset, scratch.like(("w", j), delta))


# TIES-merging: M = B + lambda * disjoint_mean_i(w_i trim(D_i))
ties = gta_kernel(magnitude, _trimmed, consensus=True, normalize_default=True)


# The catalog keeps each expert tensor's exact TIES trim threshold at every whole percent of
# density (tensor_stats.trim_*: one entry per 1%; docs/catalog.md#definitions, "TIES trim threshold").
TRIM_GRID = 100


def on_grid(density: float) -> bool:
    """On the 1% grid the catalog keeps exact trim thresholds for (the one test of it)."""
    return abs(density * TRIM_GRID - round(density * TRIM_GRID)) <= 1e-6


def grid_index(density: float) -> int | None:
    """The 1-based index of `density` on the trim grid (SQL arrays are 1-based), or None when
    it is off the grid or outside (0, 1]."""
    j = round(density * TRIM_GRID)
    return j if 1 <= j <= TRIM_GRID and on_grid(density) else None


def _grid_setting(s: Setting) -> bool:
    """A per-tensor density setting that only gives values on the grid (no gradient)."""
    if is_scalar(s):
        return on_grid(float(s))
    if all(is_scalar(v) for v in s):  # a gradient: interpolated values fall off the grid
        return len(s) == 1 and on_grid(float(s[0]))
    return all(_grid_setting(c["value"]) for c in s)


def whole_tensor_for(params: Mapping[str, Any], densities: Sequence[float]) -> str | None:
    """mergekit configs with `rescale: true` or a density off the 1% grid (a gradient too): the
    trim threshold and the L1 norms come from the whole tensor, as mergekit computes them."""
    if params.get("semantics") != "mergekit":
        return None
    if params.get("rescale", "none") != "none":
        return "each expert's L1 norm before and after the trim (mergekit's rescale)"
    chains = (params.get("tensor_params") or {}).get("density") or []
    if (not all(on_grid(d) for d in densities)
            or not all(_grid_setting(s) for chain in chains if chain for s in chain)):
        return "each expert's magnitude threshold at a density off the catalog's 1% grid"
    return None


def _check(params: Mapping[str, Any], densities: Sequence[float]) -> None:
    if params.get("rescale", "none") != "none" and params.get("semantics") != "mergekit":
        raise InvalidRequest("params.rescale: l1 for ties is mergekit's rescale: true and "
                             "applies to mergekit configs (mergepipe merge CONFIG.yml)",
                             field="params.rescale")


def _translate(p: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """mergekit's boolean `rescale` (default false) -> rescale: l1 or nothing."""
    value = p.pop("rescale", None)
    if value is True:
        return {**p, "rescale": "l1"}
    if value not in (None, False):
        raise InvalidRequest(f"parameters.rescale: must be true or false, got {value!r}",
                             field="parameters.rescale")
    return p


SPEC = OperatorSpec(
    name="ties", title="TIES",
    formula="M = B + lambda * disjoint_mean_i(w_i trim(D_i, density_i))",
    kernel=ties, normalize_default=True, additive=False, density=True, trim=True,
    params=(Param("rescale", str, "none", ("none", "l1"), optional=True,
                  help="l1: each trimmed expert tensor rescaled to its untrimmed L1 norm "
                       "(mergekit's rescale: true; mergekit configs only)"),),
    whole_tensor_for=whole_tensor_for, check=_check,
    # (expert, block) units: on both fidelity families they kept TIES closer to the full merge
    # than coherent groups (docs/FIDELITY.md, "Planning units"); unit=group opts in. Ranked
    # by the regime rule, as della: per_tensor for flat updates, else region_energy (the
    # disjoint mean's output change); over eleven families (four held out) below random plans
    # of equal bytes in 51 of 55 cells, with the lowest mean KL at 0.3 / 0.5
    # (docs/FIDELITY.md, "The regime rule")
    default_utility="auto", auto_utility=("per_tensor", "region_energy"),
    not_incremental=("TIES trims each expert at its own magnitude threshold and elects each "
                     "entry's sign over all experts together: one expert more can flip signs "
                     "everywhere"),
    mergekit=MergekitMethod("ties", params={"normalize": "normalize", "lambda": "lambda",
                                            "rescale": "rescale"}, translate=_translate),
    fused=FusedKernel("ties"),
)
