"""Band thresholds (breadcrumbs): the two magnitude cuts of each expert tensor from the catalog's
1% trim grid, exact wherever the grid determines them.

A cut at rank k (keep the k largest |delta|, ties at the k-th kept by the keyed rule) is the
threshold (tau, above, tied, k) of the k-th largest entry. The grid stores it exactly for
k_j = max(1, int(j / 100 * numel)), j = 1..100, and the same tau serves every k of its tied run:
above_j <= k <= above_j + tied_j. So a cut is exact when k is 0 or numel, or lies in the tied
run of the grid point at or above it (always so for k = k_j - 1: above_j < k_j) or of the one
below it. That covers mergekit's breadcrumbs cuts whenever gamma and density are on the 1% grid
and gamma + density <= 1 (k_upper = k_j, k_lower = int(g n) + int(d n) in {k_j - 1, k_j}).
Otherwise the k-th largest lies strictly between two grid thresholds whose values the catalog
does not keep: the cut is the grid point whose count of kept entries is nearer to k (off by
less than 1% of the tensor's entries).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from mergepipe.core.request import MergeRequest
from mergepipe.planner.weights import trim_k

Cut = tuple[float, int, int, int]  # tau, above, tied, k (planner.plan.TrimThreshold's fields)


def cut_at(k: int, numel: int, taus: Sequence[float], aboves: Sequence[int],
           tieds: Sequence[int]) -> tuple[Cut, bool]:
    """The threshold keeping the k largest |delta| of a tensor, and whether it is exact."""
    if k <= 0:
        return (float("inf"), 0, 0, 0), True
    if k >= numel:  # keep everything: |d| > 0, and zeros are zeros
        return (0.0, numel, 0, numel), True
    ks = [trim_k(j + 1, numel) for j in range(len(taus))]  # the grid's k (catalog.stats)
    j = bisect.bisect_left(ks, k)  # the first grid point with k_j >= k
    if j < len(ks) and aboves[j] <= k:  # above_j == k: |d| > tau_j is the top k
        return (float(taus[j]), int(aboves[j]), int(tieds[j]), k), True
    if j > 0 and aboves[j - 1] + tieds[j - 1] >= k:
        return (float(taus[j - 1]), int(aboves[j - 1]), int(tieds[j - 1]), k), True
    options = []
    if j < len(ks):  # keep |d| > tau_j: above_j entries
        options.append((abs(aboves[j] - k), (float(taus[j]), int(aboves[j]), int(tieds[j]),
                                             int(aboves[j]))))
    if j > 0:  # keep |d| >= tau_{j-1}: above + tied entries
        n = int(aboves[j - 1] + tieds[j - 1])
        options.append((abs(n - k), (float(taus[j - 1]), int(aboves[j - 1]), int(tieds[j - 1]),
                                     n)))
    return min(options)[1], False


def band_cuts(request: MergeRequest, rows: list[tuple[Any, ...]],
              tensor_values: Mapping[tuple[str, str], Mapping[str, float]] | None = None
              ) -> dict[tuple[str, str], tuple[Cut, Cut | None]]:
    """(lower cut, upper cut or None) of each expert tensor with statistics, at the expert's
    density there (its per-tensor value where a config gives one, planner.tensor_values) and
    the request's parameters (rows: knapsack.trim_grid_rows)."""
    cuts_of = request.spec.cuts
    if cuts_of is None:
        return {}
    densities = request.densities()
    out: dict[tuple[str, str], tuple[Cut, Cut | None]] = {}
    for position, model, tensor, numel, taus, aboves, tieds in rows:
        own = (tensor_values or {}).get((model, tensor), {})
        density = float(own.get("density", densities[int(position)]))
        ranks = cuts_of(int(numel), density, request.params)
        if ranks is None:  # no band (density 1: everything is kept)
            continue
        hi, lo = ranks
        lo_cut, _ = cut_at(lo, int(numel), taus, aboves, tieds)
        hi_cut = cut_at(hi, int(numel), taus, aboves, tieds)[0] if hi > 0 else None
        out[(model, tensor)] = (lo_cut, hi_cut)
    return out
