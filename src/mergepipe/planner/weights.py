"""Per-expert ranking weights |alpha_i| and TIES trim-grid indexes derived from a merge request."""

from __future__ import annotations

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.ties import TRIM_GRID, grid_index
from mergepipe.core.request import MergeRequest


def rank_weights(request: MergeRequest) -> list[float]:
    """|alpha_i| per expert: the coefficient the operator applies to D_i (a ranking weight for
    ties/dare: |lambda * w_i|, divided by sum w when normalize)."""
    return [abs(a) for a in request.coefficients()]


def trim_index(density: float, model: str) -> int:
    """1-based index of `density` on the catalog's 1% trim grid (SQL arrays are 1-based)."""
    j = grid_index(density)
    if j is None:
        raise InvalidRequest(f"ties density {density} of expert {model!r} is not on the 1% grid "
                             "of the catalog's trim thresholds", field="density")
    return j


def trim_k(j: int, numel: int) -> int:
    """Entries kept by the trim at grid index j: k = max(1, int(density * numel)), density =
    j / 100 (mergekit's floor)."""
    return max(1 if numel else 0, int(j / TRIM_GRID * numel))


def trim_indexes(request: MergeRequest) -> list[int | None]:
    """Per expert: the trim-grid index for `ties` (whose trim excludes blocks), else None."""
    if not request.spec.trim or request.whole_tensor is not None:  # thresholds from the tensor
        return [None] * len(request.experts)
    return [trim_index(d, e.model)
            for d, e in zip(request.densities(), request.experts, strict=True)]
