"""The plan of a budgeted merge (`make_plan`) and its report (`Plan.summary`)."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from mergepipe.catalog.calibrations import (
    calibration_fisher,
    calibration_vectors,
    latest_calibration,
)
from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import Catalog, register_sql_package
from mergepipe.catalog.records import TouchedBlock
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.jsonable import jsonable
from mergepipe.core.operators.spec import PLANNING_UNITS
from mergepipe.core.request import MergeRequest
from mergepipe.core.tensor_params import TENSOR_PARAMS
from mergepipe.planner import bands, knapsack
from mergepipe.planner.activation import UTILITIES as ACTIVATION_UTILITIES
from mergepipe.planner.activation import Calibration
from mergepipe.planner.hashing import plan_hash
from mergepipe.planner.tensor_values import Resolved, TensorValues, resolve_request
from mergepipe.planner.validate import ModelInfo, load_models
from mergepipe.planner.weights import rank_weights, trim_indexes, trim_k

register_sql_package("mergepipe.planner")

# utility=auto: experts whose update's per-entry RMS varies across their tensors by a
# coefficient of variation under this (median over the experts) have flat updates
# (knapsack.delta_spread; measured 0.11-0.16 on brief low-rate fine-tunes, 0.27-0.42 on
# longer ones: docs/FIDELITY.md, "The regime rule")
FLAT_SPREAD = 0.22

FALLBACK_ORDER = ("whole tensors, ranked after every block of the experts with statistics, "
                  "in checkpoint order (tensor ordinal, then expert position)")


@dataclass(frozen=True)
class TrimThreshold:
    """TIES trim of one (expert, tensor) at the requested density (docs/operators.md#ties)."""

    tau: float   # k-th largest |delta|
    above: int   # count of |delta| > tau
    tied: int    # count of |delta| == tau
    k: int       # int(density * numel)
    # breadcrumbs: the upper cut (entries it keeps are the outliers dropped); None: no upper cut
    upper: TrimThreshold | None = None

    def doc(self) -> dict[str, Any]:
        """The JSON form a merge's record keeps (tau None: infinite)."""
        d = {"tau": None if math.isinf(self.tau) else float(self.tau), "above": int(self.above),
             "tied": int(self.tied), "k": int(self.k)}
        return d if self.upper is None else {**d, "upper": self.upper.doc()}

    @staticmethod
    def from_doc(t: dict[str, Any]) -> TrimThreshold:
        up = t.get("upper")
        return TrimThreshold(math.inf if t["tau"] is None else float(t["tau"]), int(t["above"]),
                             int(t["tied"]), int(t["k"]),
                             None if up is None else TrimThreshold.from_doc(up))

    def hashed(self) -> list[Any]:
        """The plan hash's form (ties: as before bands existed)."""
        own = [self.tau if math.isfinite(self.tau) else repr(self.tau), self.above, self.tied,
               self.k]
        return own if self.upper is None else [*own, self.upper.hashed()]


PlannedBlock = TouchedBlock  # one expert block of the access set, as touched_blocks stores it


@dataclass(frozen=True)
class BlockRows:
    """The catalog rows of a plan's blocks as the planner read them (knapsack.access: model,
    tensor, block_index, nbytes, utility, content_hash, row_start, row_end, file_index,
    byte_offset), so that the executor's check of the plan needs not read them again. Neither
    recorded nor hashed. A model's blocks are written with its row and never changed, so rows
    once read stay true for that catalog and model row (name and created_at)."""

    catalog: str                       # the catalog's location
    created: dict[str, str | None]     # model name -> its row's created_at, when read
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True)
class ExpertPlan:
    """One expert's share of the plan."""

    position: int
    model: str
    kind: str
    weight: float
    density: float | None
    coefficient: float        # alpha_i (the ranking weight's sign included)
    fallback: bool            # planned at tensor granularity (no statistics)
    candidate_blocks: int
    selected_blocks: int
    full_read_bytes: int
    planned_bytes: int        # selected bytes incl. lora_A once per touched tensor

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "kind": self.kind, "weight": self.weight,
                "density": self.density, "coefficient": self.coefficient,
                "fallback": self.fallback, "candidate_blocks": self.candidate_blocks,
                "selected_blocks": self.selected_blocks, "full_read_bytes": self.full_read_bytes,
                "planned_bytes": self.planned_bytes}


@dataclass
class Plan:
    """The access set of a merge under its budget, with what the user needs to judge it.

    The executor runs any Plan: the planner's, one rebuilt from a merge's record (replay), or a
    benchmark's baseline of equal bytes."""

    request: MergeRequest
    plan_hash: str
    budget_bytes: int
    full_read_bytes: int
    planned_expert_bytes: int
    blocks: list[PlannedBlock]
    omission_bound: float | None = None
    fallback_experts: list[str] = field(default_factory=list)
    trims: dict[tuple[str, str], TrimThreshold] = field(default_factory=dict)
    experts: list[ExpertPlan] = field(default_factory=list)
    candidate_blocks: int = 0
    omission_bound_note: str | None = None   # why there is no bound, when there is none
    # sqrt(sum over (tensor, block) of (omitted utility there)^2): also sound for additive
    # operators (blocks have disjoint coordinates) and <= omission_bound; None when that is None
    omission_bound_l2: float | None = None
    planning_seconds: float = 0.0
    unit: str = "expert_block"  # the planning unit (core.operators.spec.PLANNING_UNITS)
    # how the merge is computed (planner.incremental): strategy chosen, both strategies' bytes,
    # the reused merge and the user's request; None for a plan made by make_plan alone
    strategy: dict[str, Any] | None = None
    # per-tensor parameters (mergekit gradients, filter: values): (model, tensor) -> the weight
    # and density there, where they differ from the expert's own (planner.tensor_values)
    tensor_params: TensorValues = field(default_factory=dict)
    # a plan that reads no expert byte although some could be read: the smallest budget that
    # reads one (the cheapest candidate unit); None otherwise (planner.incremental refuses it)
    min_useful_bytes: int | None = None
    # omission_bound_l2 with nothing read (every candidate omitted): the bound of the full
    # merge's update, the predicted deviation's denominator; None where omission_bound_l2 is
    update_bound_l2: float | None = None
    # how a target deviation chose the budget (jobs.planning.BudgetSearch.to_dict); None: given
    budget_search: dict[str, Any] | None = None
    # utility=activation or fisher: the calibration ranked with (catalog.calibrations.CalibrationRow's
    # dict); None otherwise
    calibration: dict[str, Any] | None = None
    # utility=auto: the ranking it chose and why (resolve_utility's dict); None otherwise
    ranking: dict[str, Any] | None = None
    # the planner's catalog rows of `blocks` (None: a plan rebuilt from a record or made by hand)
    block_rows: BlockRows | None = field(default=None, repr=False, compare=False)

    @property
    def predicted_deviation(self) -> float | None:
        """omission_bound_l2 / update_bound_l2: the share of the full merge's update (its
        bound) that the plan may leave out; 0 at the full budget, 1 reading nothing; None
        without a bound (docs/deviation.md#predicted-deviation)."""
        if self.omission_bound_l2 is None or self.update_bound_l2 is None:
            return None
        if self.update_bound_l2 <= 0.0:
            return 0.0  # no expert differs from the base: nothing to leave out
        return self.omission_bound_l2 / self.update_bound_l2

    def selected(self) -> dict[tuple[str, str], set[int]]:
        """(model, tensor) -> indexes of the blocks to read."""
        out: dict[tuple[str, str], set[int]] = {}
        for b in self.blocks:
            out.setdefault((b.model, b.tensor), set()).add(b.block_index)
        return out

    @property
    def touched_ratio(self) -> float:
        """Planned bytes over the operator's full-read bytes (0.0 when there is nothing to read)."""
        return self.planned_expert_bytes / self.full_read_bytes if self.full_read_bytes else 0.0

    def document(self) -> dict[str, Any]:
        """The summary plus the TIES trims: what a merge's record keeps to re-execute the plan."""
        doc = dict(jsonable(self.summary()))
        doc["trims"] = [{"model": m, "tensor": t, **tr.doc()}
                        for (m, t), tr in sorted(self.trims.items())]
        return doc

    @staticmethod
    def from_document(request: MergeRequest, doc: dict[str, Any],
                      blocks: list[PlannedBlock]) -> Plan:
        """The plan a merge recorded (`document()` and its touched_blocks), to execute again."""
        trims = {(t["model"], t["tensor"]): TrimThreshold.from_doc(t)
                 for t in doc.get("trims", [])}
        experts = [ExpertPlan(position=i, **e) for i, e in enumerate(doc.get("experts", []))]
        return Plan(
            request=request, plan_hash=str(doc["plan_hash"]), budget_bytes=int(doc["budget_bytes"]),
            full_read_bytes=int(doc["full_read_bytes"]),
            planned_expert_bytes=int(doc["planned_expert_bytes"]), blocks=blocks,
            omission_bound=doc.get("omission_bound"),
            fallback_experts=list(doc.get("fallback_experts") or []), trims=trims,
            experts=experts, candidate_blocks=int(doc.get("candidate_blocks") or 0),
            omission_bound_note=doc.get("omission_bound_note"),
            omission_bound_l2=doc.get("omission_bound_l2"),
            update_bound_l2=doc.get("update_bound_l2"),
            planning_seconds=float(doc.get("planning_seconds") or 0.0),
            unit=str(doc.get("unit") or "expert_block"),
            strategy=doc.get("strategy"),
            tensor_params={(v["model"], v["tensor"]): {k: float(v[k]) for k in TENSOR_PARAMS
                                                       if k in v}
                           for v in doc.get("tensor_params") or []},
            calibration=doc.get("calibration"), ranking=doc.get("ranking"))

    def summary(self) -> dict[str, Any]:
        """The plan report (CLI --json, POST /v1/plans, the merge manifest)."""
        r = self.request
        return {
            "plan_hash": self.plan_hash,
            "operator": r.operator,
            "base": r.base,
            "experts": [e.to_dict() for e in self.experts],
            "params": dict(r.params),
            "seed": r.seed,
            "budget": r.budget.to_dict(),
            "budget_bytes": self.budget_bytes,
            "full_read_bytes": self.full_read_bytes,
            "planned_expert_bytes": self.planned_expert_bytes,
            "touched_ratio": self.touched_ratio,
            "selected_blocks": len(self.blocks),
            "candidate_blocks": self.candidate_blocks,
            "omission_bound": self.omission_bound,
            "omission_bound_l2": self.omission_bound_l2,
            "omission_bound_note": self.omission_bound_note,
            "update_bound_l2": self.update_bound_l2,
            "predicted_deviation": self.predicted_deviation,
            "fallback_experts": list(self.fallback_experts),
            "fallback_order": FALLBACK_ORDER if self.fallback_experts else None,
            "planning_seconds": self.planning_seconds,
            "unit": self.unit,
            "unit_region": PLANNING_UNITS.get(self.unit),
            **({"strategy": self.strategy} if self.strategy is not None else {}),
            **({"budget_search": self.budget_search} if self.budget_search is not None else {}),
            **({"tensor_params": tensor_value_rows(self.tensor_params)}
               if self.tensor_params else {}),
            **({"calibration": self.calibration} if self.calibration is not None else {}),
            **({"ranking": self.ranking} if self.ranking is not None else {}),
        }


def tensor_value_rows(values: TensorValues) -> list[dict[str, Any]]:
    """The per-tensor values as the plan document and the manifest show them, sorted."""
    return [{"model": m, "tensor": t, **v} for (m, t), v in sorted(values.items())]


def bound_note(request: MergeRequest, fallback: list[str]) -> str | None:
    """Why the omitted-update bound does not apply to this request (None: it applies)."""
    note = request.spec.bound_note(request.params)
    if note is not None:
        return note
    if fallback:
        return f"no bound: no statistics for {', '.join(fallback)}"
    return None


def _expert_plans(request: MergeRequest, models: list[ModelInfo],
                  per_expert: dict[int, knapsack.ExpertTotals]) -> list[ExpertPlan]:
    sparse = request.spec.density
    densities = request.densities()
    empty = knapsack.ExpertTotals(0, 0, 0, 0, 0.0)
    out = []
    for i, (m, spec, alpha) in enumerate(zip(models, request.experts, request.coefficients(),
                                             strict=True)):
        t = per_expert.get(i, empty)
        out.append(ExpertPlan(i, m.name, m.kind, spec.weight, densities[i] if sparse else None,
                              alpha, not m.has_stats, t.candidate_blocks, t.selected_blocks,
                              t.full_read_bytes, t.planned_bytes))
    return out


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while 10^5+ acyclic tuples are allocated (halves the time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def empty_plan_error(budget_bytes: int, cheapest: int) -> InvalidRequest:
    """The refusal of a budget that reads no expert byte although some block could be read."""
    return InvalidRequest(
        f"budget {budget_bytes} B reads no expert byte (the output would be a copy of the "
        f"base): the cheapest candidate unit costs {cheapest} B; the smallest useful budget is "
        f"{cheapest}B", field="budget")


@dataclass(frozen=True)
class Candidates:
    """What building a request's ranked candidate units found out (`_candidates`)."""

    base: ModelInfo
    experts: list[ModelInfo]
    resolved: Resolved  # the per-tensor values
    calibration: Calibration | None  # the one ranked with (utility=activation, fisher)
    unit: str  # the planning unit
    full_read: int  # C_full
    ranking: dict[str, Any] | None  # how utility=auto chose (resolve_utility)


def auto_ranking(pair: tuple[str, str], spread: float | None) -> tuple[str, str | None]:
    """utility=auto's choice from an operator's (flat, peaked) pair and the experts' delta
    spread: (ranking, regime). The regime is None without a spread (no expert changes a
    tensor, or the pair is one ranking and the spread was not read): the peaked ranking."""
    flat, peaked = pair
    regime = None if spread is None else "flat" if spread < FLAT_SPREAD else "peaked"
    return (flat if regime == "flat" or flat == peaked else peaked), regime


def resolve_utility(conn: Connection, location: str, request: MergeRequest,
                    experts: list[ModelInfo]) -> tuple[str, dict[str, Any] | None]:
    """The ranking the request plans with, and (utility=auto) how it was chosen: the spec's
    flat ranking when the experts' delta spread is below FLAT_SPREAD, else its peaked one.
    The spread is not read when both are the same ranking; without a spread (that, or no
    expert changes a tensor) the regime is None."""
    utility = str(request.params.get("utility", request.spec.default_utility))
    if utility != "auto":
        return utility, None
    flat, peaked = request.spec.auto_utility
    spread = delta_spread(conn, location, experts) if flat != peaked else None
    chosen, regime = auto_ranking((flat, peaked), spread)
    return chosen, {"utility": chosen, "delta_spread": spread, "flat_below": FLAT_SPREAD,
                    "regime": regime}


def _candidates(conn: Connection, location: str, request: MergeRequest) -> Candidates:
    """Load the request and build its ranked candidate units (`location`: the catalog's)."""
    base, models = load_models(conn, request)
    resolved = resolve_request(request, knapsack.base_tensors(conn, base.name)
                               if request.params.get("tensor_params") else [])
    utility, ranking = resolve_utility(conn, location, request, models)
    cal = _calibration(conn, base.name, utility) if utility in ACTIVATION_UTILITIES else None
    knapsack.load_request(conn, models, rank_weights(request), trim_indexes(request),
                          utility, resolved.rows, cal)
    unit = request.planning_unit
    full_read = knapsack.build_candidates(conn, PLANNING_UNITS[unit], utility,
                                          fallback=not all(m.has_stats for m in models))
    return Candidates(base, models, resolved, cal, unit, full_read, ranking)


def _calibration(conn: Connection, base: str, utility: str) -> Calibration:
    """The base's newest calibration, or InvalidRequest saying how to make one."""
    row = latest_calibration(conn, base)
    if row is None:
        raise InvalidRequest(f"utility={utility} ranks blocks by the base's activations, and "
                             f"base {base!r} has no calibration: run `mergepipe calibrate "
                             f"{base} --text FILE` first", field="params.utility")
    vectors = calibration_vectors(conn, row.calibration_id)
    fisher = calibration_fisher(conn, row.calibration_id) if utility == "fisher" else {}
    return Calibration(row, {t: v.group_ms for t, v in vectors.items()}, fisher)


class _RowValues:
    """Values computed from one model's catalog rows, kept per (catalog, model name, the row's
    created_at): a model row's blocks and statistics are written with the row, in one
    transaction, and never changed, and a name registered again is a new row; so a value once
    computed stays true. At most `size` are kept (the oldest dropped first)."""

    def __init__(self, size: int = 256) -> None:
        self._values: dict[tuple[str, str, str], Any] = {}
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> Any:
        """The value kept for `key`, or _NOT_KEPT."""
        return self._values.get(key, _NOT_KEPT)

    def put(self, key: tuple[str, str, str], value: Any) -> None:
        with self._lock:
            if key not in self._values and len(self._values) >= self._size:
                del self._values[next(iter(self._values))]
            self._values[key] = value


_NOT_KEPT = object()
_CONTENT_DIGESTS = _RowValues()  # the base's content digest (the plan hash's base_content)
_EXPERT_SPREADS = _RowValues()   # an expert's spread (knapsack.expert_spreads), None: no tensor


def base_content(cat: Catalog, conn: Connection, name: str, created_at: str | None) -> str:
    """sha256 of the block content hashes of model `name` whose row was created at
    `created_at` (knapsack.content_digest), read once per model row and catalog."""
    if created_at is None:  # no identity for the row: read it every time
        return knapsack.content_digest(conn, name)
    key = (str(cat.location), name, created_at)
    digest = _CONTENT_DIGESTS.get(key)
    if digest is _NOT_KEPT:
        digest = knapsack.content_digest(conn, name)
        _CONTENT_DIGESTS.put(key, digest)
    return str(digest)


def delta_spread(conn: Connection, location: str, experts: list[ModelInfo]) -> float | None:
    """The delta spread of `experts` (those with statistics), each expert's spread read once
    per model row and catalog (knapsack.median_spread of knapsack.expert_spreads)."""
    known: dict[str, float | None] = {}
    for m in experts:
        if m.has_stats and m.created_at is not None:
            v = _EXPERT_SPREADS.get((location, m.name, m.created_at))
            if v is not _NOT_KEPT:
                known[m.name] = v
    missing = [m for m in experts if m.has_stats and m.name not in known]
    if missing:
        read = knapsack.expert_spreads(conn, [m.name for m in missing])
        for m in missing:
            known[m.name] = read.get(m.name)
            if m.created_at is not None:
                _EXPERT_SPREADS.put((location, m.name, m.created_at), known[m.name])
    return knapsack.median_spread(v for v in known.values() if v is not None)


def check_budget_reads(cat: Catalog, request: MergeRequest) -> None:
    """Refuse (InvalidRequest) a budget under the cheapest candidate unit, before a merge is
    queued: its plan would read no expert byte. Builds the candidates only (no knapsack)."""
    with cat.reader() as conn:
        c = _candidates(conn, str(cat.location), request)
        budget = request.budget.resolve(c.full_read)
        cheapest = (knapsack.cheapest_unit(conn, PLANNING_UNITS[c.unit] is not None)
                    if c.full_read else None)
    if cheapest is not None and budget < cheapest:
        raise empty_plan_error(budget, cheapest)


def make_plan(cat: Catalog, request: MergeRequest) -> Plan:
    """Validate `request` against the catalog and choose its access set under the budget."""
    t0 = time.perf_counter()
    with cat.reader() as conn:
        c = _candidates(conn, str(cat.location), request)
        base, models, resolved, cal, unit, full_read = (c.base, c.experts, c.resolved,
                                                         c.calibration, c.unit, c.full_read)
        budget = request.budget.resolve(full_read)
        grouped = PLANNING_UNITS[unit] is not None
        planned = knapsack.select(conn, budget, grouped=grouped)
        min_useful = (knapsack.cheapest_unit(conn, grouped) if planned == 0 and full_read
                      else None)
        per_expert = knapsack.totals(conn, budget)
        bound_l2, update_l2 = (knapsack.l2_bounds(conn, budget) if request.spec.additive
                               else (None, None))
        with _gc_paused():
            rows, access_digest, read = knapsack.access(conn, budget)
            # C-level construction (row + rank): a full-budget plan has 10^5+ blocks.
            blocks = list(map(PlannedBlock._make, map(tuple.__add__, rows, zip(count()))))
        trim_rows = (knapsack.trim_rows(conn)
                     if any(j is not None for j in trim_indexes(request)) else [])
        band_rows = knapsack.trim_grid_rows(conn) if request.spec.cuts else []
        base_digest = base_content(cat, conn, base.name, base.created_at)
        # lora_A rows exist for LoRA adapters only (catalog.ingest)
        lora = (knapsack.lora_identity(conn) if any(m.kind == "lora" for m in models)
                else {})

    trims = {(m, t): TrimThreshold(float(tau), int(above), int(tied), trim_k(j, numel))
             for m, t, numel, j, tau, above, tied in trim_rows}
    cuts = bands.band_cuts(request, band_rows, resolved.values)
    trims.update({key: TrimThreshold(*lo, upper=None if hi is None else TrimThreshold(*hi))
                  for key, (lo, hi) in cuts.items()})
    fallback = [m.name for m in models if not m.has_stats]
    experts = _expert_plans(request, models, per_expert)
    note = bound_note(request, fallback)
    bound = None if note else math.fsum(t.omitted_utility for t in per_expert.values())
    # min: both are sound; the sums are rounded in different orders (SQL vs fsum), and the
    # reported l2 bound must never exceed the omission bound (docs/catalog.md#definitions) by a rounding ulp
    bound_l2 = None if bound is None or bound_l2 is None else min(bound_l2, bound)
    update_l2 = None if bound_l2 is None else update_l2
    touched = {(b.model, b.tensor) for b in blocks} if trims else set()
    digest = plan_hash(
        request=request.to_dict(),
        budget_bytes=budget,
        base_content=base_digest,
        experts=[{"model": m.name, "kind": m.kind, "has_stats": m.has_stats,
                  "lora_scale": m.lora_scale, "lora": lora.get(i, [])}
                 for i, m in enumerate(models)],
        trims=sorted([m, t, *tr.hashed()] for (m, t), tr in trims.items() if (m, t) in touched),
        access=access_digest,
        unit=unit,
        tensor_params=tensor_value_rows(resolved.values) or None,
        calibration=None if cal is None else cal.row.calibration_id,
    )
    return Plan(
        request=request, plan_hash=digest, budget_bytes=budget, full_read_bytes=full_read,
        planned_expert_bytes=planned, omission_bound=bound, fallback_experts=fallback,
        blocks=blocks, trims=trims, experts=experts,
        candidate_blocks=sum(e.candidate_blocks for e in experts), omission_bound_note=note,
        omission_bound_l2=bound_l2, planning_seconds=time.perf_counter() - t0, unit=unit,
        tensor_params=resolved.values, min_useful_bytes=min_useful,
        update_bound_l2=update_l2,
        calibration=None if cal is None else cal.row.to_dict(), ranking=c.ranking,
        block_rows=BlockRows(str(cat.location), {m.name: m.created_at for m in models}, read))
