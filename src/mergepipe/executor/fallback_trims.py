"""Trim thresholds of experts registered without statistics, for the operators that trim by
magnitude (ties and the breadcrumbs band operators), filled into the plan before execution.

The catalog has no tensor_stats rows for such an expert, so the plan holds no threshold for it.
`fill_fallback_trims` computes the rows ingestion with statistics would have stored
(catalog.ingest.trim_grids: ingestion's own scan of its files) for the tensors the plan reads of
it, and the thresholds the planner derives from them. A fallback expert is planned as whole
tensors, so a tensor read is read whole and its thresholds are the full merge's at every
budget: the output bytes are those of the same merge with statistics. Planning itself reads no
file; the plan hash needs no thresholds (they follow from the block contents it covers)."""

from __future__ import annotations

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import trim_grids
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.ties import grid_index
from mergepipe.planner import bands
from mergepipe.planner.plan import Plan, TrimThreshold
from mergepipe.planner.weights import trim_k


def fill_fallback_trims(cat: Catalog, plan: Plan) -> None:
    """Add to `plan.trims` the thresholds of the tensors it reads of experts without
    statistics, where its operator trims by magnitude; then refuse (InvalidRequest naming the
    expert) a trimmed expert tensor left without one, which would merge untrimmed."""
    req = plan.request
    grid = req.spec.trim and req.whole_tensor is None  # else the kernel's own thresholds
    if not grid and req.spec.cuts is None:
        return
    touched: dict[str, set[str]] = {}
    for b in plan.blocks:
        touched.setdefault(b.model, set()).add(b.tensor)
    densities = req.densities()
    rows = []
    for e in plan.experts:
        if not e.fallback or e.model in {m for m, _ in plan.trims} or e.model not in touched:
            continue
        for tensor, g in sorted(trim_grids(cat, e.model, touched[e.model]).items()):
            if req.spec.cuts is not None:
                rows.append((e.position, e.model, tensor, g.numel, g.tau, g.above, g.tied))
                continue
            own = plan.tensor_params.get((e.model, tensor), {})
            j = grid_index(float(own.get("density", densities[e.position])))
            assert j is not None  # the planner refused densities off the grid
            plan.trims[(e.model, tensor)] = TrimThreshold(
                float(g.tau[j - 1]), int(g.above[j - 1]), int(g.tied[j - 1]), trim_k(j, g.numel))
    for key, (lo, hi) in bands.band_cuts(req, rows, plan.tensor_params).items():
        plan.trims[key] = TrimThreshold(*lo, upper=None if hi is None else TrimThreshold(*hi))
    if grid:
        _check_trimmed(plan, touched)


def _check_trimmed(plan: Plan, touched: dict[str, set[str]]) -> None:
    """Every tensor read of a trimmed expert has its threshold (else it would merge untrimmed)."""
    for e in plan.experts:
        missing = sorted(touched.get(e.model, set()) - {t for m, t in plan.trims if m == e.model})
        if missing:
            raise InvalidRequest(
                f"expert {e.model!r}: no TIES trim threshold for tensor {missing[0]!r}; "
                f"re-ingest {e.model!r} with statistics (without --no-stats)", field="experts")
