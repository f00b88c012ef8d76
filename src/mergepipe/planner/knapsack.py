"""Run the planner's SQL: candidate units, knapsack prefix and fill passes, totals, access set."""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from mergepipe.catalog.connection import SQL, Connection, Row
from mergepipe.catalog.db import load_sql
from mergepipe.core.errors import BudgetViolation, InvalidRequest
from mergepipe.planner.activation import UTILITIES as ACTIVATION_UTILITIES
from mergepipe.planner.activation import Calibration, activation_rows
from mergepipe.planner.validate import ModelInfo


@dataclass(frozen=True)
class ExpertTotals:
    """One expert's candidate and selected blocks and bytes after the knapsack."""

    candidate_blocks: int
    selected_blocks: int
    full_read_bytes: int
    planned_bytes: int
    omitted_utility: float


# Diminishing-returns rankings: the stratum within which a unit's share is discounted by its
# rank k, sqrt(k) - sqrt(k - 1) (planner_rank_diminish.sql, docs/catalog.md#rankings).
STRATA = {"coverage": "tensor", "stratified": "region"}


def load_request(conn: Connection, experts: list[ModelInfo], rank_weights: list[float],
                 trim_js: list[int | None], utility: str = "l2",
                 tensor_rows: Sequence[dict[str, Any]] = (),
                 calibration: Calibration | None = None) -> None:
    """Put the request's experts in this connection's temp table (bound parameters only).
    utility: the ranking score (mergepipe.request.UTILITIES). tensor_rows: per-(expert, tensor)
    rank weights and trim indexes (position, tensor, rank_weight, trim_j) that override the
    expert's (per-tensor parameters). calibration: the base's, for the calibrated utilities
    (planner.activation). Each table is made from column lists in one
    statement."""
    activation = utility in ACTIVATION_UTILITIES
    if activation and calibration is None:
        raise InvalidRequest(f"utility={utility} needs a calibration of the base",
                             field="params.utility")
    conn.execute(load_sql("planner_request_create"), {
        "position": list(range(len(experts))), "model": [m.name for m in experts],
        "rank_weight": list(rank_weights), "trim_j": list(trim_js),
        "has_stats": [m.has_stats for m in experts],
        "per_tensor": utility in ("per_tensor", *STRATA), "activation": activation})
    conn.execute(load_sql("planner_tensor_params_create"),
                 {k: [r[k] for r in tensor_rows]
                  for k in ("position", "tensor", "rank_weight", "trim_j")})
    acts: dict[str, list[Any]] = {}
    if activation:
        assert calibration is not None
        acts = activation_rows(conn, experts, calibration, utility)
    conn.execute(load_sql("planner_activation_create"),
                 {k: acts.get(k, []) for k in ("position", "tensor", "block_index", "act")})


def candidates_sql(region: str | None = None, utility: str = "l2", fallback: bool = True
                   ) -> SQL:
    """The one statement that creates the ranked candidate units (planner_candidates.sql): the
    units and their score-per-byte order (planner_units.sql, with the whole-tensor units of
    experts without statistics when `fallback`), re-ranked by the ranking pieces the request
    asks for (planner_rank_*.sql), then costed."""
    units = load_sql("planner_units").text
    fill = (load_sql("planner_units_fallback").text, " UNION ALL SELECT * FROM tensor_units")
    for key, text in zip(("{tensor_units}", "{fallback_units}"), fill if fallback else ("", ""),
                         strict=True):
        units = units.replace(key, text)
    pieces, last = [units], "ranked_units"
    for piece, name, wanted in (("planner_rank_diminish", "diminished", utility in STRATA),
                                ("planner_rank_energy", "energized", utility == "tensor_energy"),
                                ("planner_rank_region_energy", "region_energized",
                                 utility == "region_energy"),
                                ("planner_rank_group", "grouped", region is not None)):
        if wanted:
            pieces.append(load_sql(piece).text.replace("{input}", last))
            last = name
    return _compose(tuple(pieces), last, "group_rank" if region is not None else "unit_rank")


@cache
def _compose(pieces: tuple[str, ...], last: str, group_rank: str) -> SQL:
    text = load_sql("planner_candidates").text
    return SQL(text.replace("{pieces}", ",\n".join(pieces)).replace("{input}", last)
               .replace("{group_rank}", group_rank))


def build_candidates(conn: Connection, region: str | None = None, utility: str = "l2",
                     fallback: bool = True) -> int:
    """Create the ranked candidate units; returns C_full, the operator's full-read bytes.
    region ("tensor" | "block"): rank coherent groups, all experts' units of one output region
    together (PLANNING_UNITS); None: (expert, block) units one by one. utility: the ranking
    (as given to `load_request`); coverage and stratified re-rank with diminishing returns,
    tensor_energy by the squared utility over its tensor's total, region_energy by that share
    discounted by the unit's rank among its region's experts. fallback: False when every
    expert has statistics (no whole-tensor units to rank).
    Refuses (InvalidRequest) an expert whose statistics miss a candidate's rows."""
    params = {"stratum": STRATA.get(utility), "region": region}
    stmt = candidates_sql(region, utility, fallback)
    conn.execute(stmt, {k: v for k, v in params.items() if k in stmt.names})
    full_read, missing = conn.execute(load_sql("planner_full_read")).one()
    if missing:
        model, tensor, what = conn.execute(load_sql("planner_missing_stats")).one()
        raise InvalidRequest(f"expert {model!r} is registered with statistics but has no "
                             f"{what} rows for tensor {tensor!r}; re-ingest it",
                             field="experts")
    return int(full_read)


def cheapest_unit(conn: Connection, grouped: bool = False) -> int | None:
    """After `build_candidates`: the bytes of the cheapest candidate unit (grouped: group)
    alone, the smallest budget that plans an expert byte; None without candidates."""
    v = conn.execute(load_sql("planner_cheapest_group" if grouped
                              else "planner_cheapest_unit")).scalar_one()
    return None if v is None else int(v)


def select(conn: Connection, budget: int, grouped: bool = False) -> int:
    """Greedy knapsack in rank order under `budget`: the prefix whose running cost fits, then
    fill passes over the leftover until one adds nothing (grouped: whole groups only, as
    `build_candidates(region=...)` ranked them). Returns the bytes planned.
    No pass runs when the smallest unit left out is over the leftover (none could fit): it is
    read again after each pass, which costs less than a pass that finds nothing."""
    spent, smallest_left, lora = conn.execute(load_sql("planner_prefix"),
                                              {"budget": budget}).one()
    spent = int(spent)
    # without lora_A bytes every unit costs its bytes: the plain passes select the same units
    fill = load_sql(("planner_fill_pass_group" if grouped else "planner_fill_pass")
                    + ("" if lora else "_plain"))
    n = 0
    while True:
        if spent > budget:  # impossible by construction; never hand out an unsound plan
            raise BudgetViolation(f"planner selected {spent} bytes over the budget of {budget}")
        if smallest_left is None or smallest_left > budget - spent:
            return spent
        n += 1
        charged = conn.execute(fill, {"pass": n, "budget": budget,
                                      "remaining": budget - spent}).tuples()
        if not charged:
            return spent
        spent += sum(int(c) for (c,) in charged)
        smallest_left = conn.execute(load_sql("planner_smallest_left"),
                                     {"budget": budget}).scalar_one()


def totals(conn: Connection, budget: int) -> dict[int, ExpertTotals]:
    """Per expert position: candidate/selected blocks, full-read and planned bytes, omitted
    utility. Experts without any candidate are absent."""
    return {int(r[0]): ExpertTotals(int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]))
            for r in conn.execute(load_sql("planner_totals"), {"budget": budget})}


def l2_bounds(conn: Connection, budget: int) -> tuple[float | None, float | None]:
    """(omission_l2, update_l2): sqrt of the sum over (tensor, block) of the squared omitted
    utility at that block, the tighter omitted-update bound; and the same with every candidate
    omitted, the bound of the full merge's update, the denominator of the predicted deviation.
    Each None when a unit it sums has no statistics."""
    om, up = conn.execute(load_sql("planner_omission_l2"), {"budget": budget}).one()
    return (None if om is None else float(om)), (None if up is None else float(up))


def access_set(conn: Connection, budget: int) -> tuple[list[tuple[Any, ...]], str]:
    """(model, tensor, block_index, nbytes, utility) of the selected blocks in rank order, and
    the sha256 of the access set with the blocks' content hashes (`access`)."""
    rows, digest, _ = access(conn, budget)
    return rows, digest


def access(conn: Connection, budget: int
           ) -> tuple[list[tuple[Any, ...]], str, list[tuple[Any, ...]]]:
    """`access_set`, and the rows read for it: the selected blocks' catalog fields (model,
    tensor, block_index, nbytes, utility, content_hash, row_start, row_end, file_index,
    byte_offset; `Plan.block_rows`). The digest is the sha256 of one line per block, fields
    separated by U+001F (model, tensor, block_index, content_hash), lines by a newline."""
    # Plain DB-API tuples: a full-budget plan has 10^5+ rows, and Row objects cost 2x.
    rows = conn.execute(load_sql("planner_access"), {"budget": budget}).tuples()
    lines = "\n".join([f"{r[0]}\x1f{r[1]}\x1f{r[2]}\x1f{r[5]}" for r in rows])
    digest = hashlib.sha256(lines.encode()).hexdigest()
    return [r[:5] for r in rows], digest, rows


def trim_rows(conn: Connection) -> list[tuple[Any, ...]]:
    """(model, tensor, numel, trim_j, tau, above, tied) of every ties expert tensor."""
    return conn.execute(load_sql("planner_trims")).tuples()


def base_tensors(conn: Connection, model: str) -> list[tuple[str, int]]:
    """(name, numel) of the base's tensors in checkpoint order."""
    return [(str(r[0]), math.prod(int(d) for d in r[1]))
            for r in conn.execute(load_sql("planner_base_tensors"), {"model": model})]


def trim_grid_rows(conn: Connection) -> list[tuple[Any, ...]]:
    """(position, model, tensor, numel, trim_tau[], trim_above[], trim_tied[]) of every expert
    tensor with statistics: the whole 1% threshold grid (band operators, planner.bands)."""
    return conn.execute(load_sql("planner_trim_grid")).tuples()


def expert_spreads(conn: Connection, models: Sequence[str]) -> dict[str, float]:
    """utility=auto's statistic of each of `models` (experts with statistics): the coefficient
    of variation of its update's per-entry RMS across the tensors it changes. An expert that
    changes no tensor is absent."""
    return {str(m): float(v) for m, v in conn.execute(load_sql("planner_delta_spread"),
                                                      {"models": list(models)}).tuples()}


def median_spread(spreads: Iterable[float]) -> float | None:
    """The delta spread of a request: the median of its experts' spreads, to 6 decimals
    (DuckDB and PostgreSQL round their last bits apart, and it must choose alike on both);
    None when no expert changes a tensor."""
    values = list(spreads)
    return round(statistics.median(values), 6) if values else None


def delta_spread(conn: Connection, models: Sequence[str]) -> float | None:
    """The delta spread of `models` (`median_spread` of their `expert_spreads`)."""
    return median_spread(expert_spreads(conn, models).values())


def content_digest(conn: Connection, model: str) -> str:
    """sha256 of a model's block content hashes in checkpoint order."""
    return str(conn.execute(load_sql("planner_content_digest"), {"model": model}).scalar_one())


def candidate_list(conn: Connection) -> Sequence[Row]:
    """Candidate units after `build_candidates`, in rank order: model, tensor, block_index (None
    for a fallback tensor), nbytes, lora_a_nbytes, utility (None for fallback), fallback,
    unit_rank."""
    return conn.execute(load_sql("planner_candidate_list")).all()


def lora_identity(conn: Connection) -> dict[int, list[list[Any]]]:
    """Per expert position: [tensor, lora_scale, lora_a dtype, shape, nbytes, l2, l1, max_abs,
    lora_a content hash] of each LoRA-adapted tensor (what block content hashes do not cover).
    The hash is left out where the catalog has none (ingested before migration 0004), so such
    plans hash as they did before it."""
    out: dict[int, list[list[Any]]] = {}
    for r in conn.execute(load_sql("planner_lora_identity")):
        shape = None if r[4] is None else [int(d) for d in r[4]]
        row = [r[1], r[2], r[3], shape, r[5], r[6], r[7], r[8]]
        if r[9] is not None:
            row.append(r[9])
        out.setdefault(int(r[0]), []).append(row)
    return out
