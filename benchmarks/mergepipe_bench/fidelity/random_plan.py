"""Benchmark baselines: access sets with the bytes of the planner's, chosen at random or by a
different score (utility normalized per expert)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, replace

from mergepipe.catalog.db import Catalog
from mergepipe.planner import knapsack
from mergepipe.planner.plan import Plan, PlannedBlock
from mergepipe.planner.validate import load_models
from mergepipe.planner.weights import rank_weights, trim_indexes


@dataclass(frozen=True)
class Candidate:
    """One candidate block of the planner (utility = |alpha_i| * ||D_itb||_2)."""

    model: str
    tensor: str
    block_index: int
    nbytes: int
    lora_a_nbytes: int
    utility: float


def candidates(cat: Catalog, plan: Plan) -> list[Candidate]:
    """The candidate blocks the planner chose `plan`'s access set from (its own queries)."""
    req = plan.request
    with cat.reader() as conn:
        _, models = load_models(conn, req)
        knapsack.load_request(conn, models, rank_weights(req), trim_indexes(req))
        full_read = knapsack.build_candidates(conn)
        rows = knapsack.candidate_list(conn)
    if full_read != plan.full_read_bytes:
        raise RuntimeError(f"candidate set changed since planning ({full_read} bytes, plan "
                           f"{plan.full_read_bytes})")
    if any(r.fallback for r in rows):
        raise RuntimeError("random plans need block statistics for every expert (no fallback)")
    return [Candidate(r.model, r.tensor, int(r.block_index), int(r.nbytes),
                      int(r.lora_a_nbytes), float(r.utility)) for r in rows]


def random_plan(plan: Plan, cands: list[Candidate], seed: int) -> Plan:
    """A plan for the same request whose blocks are a seeded random subset of the candidates,
    as many bytes as fit in plan.planned_expert_bytes (first-fit in shuffled order)."""
    order = list(cands)
    random.Random(seed).shuffle(order)
    return _first_fit(plan, cands, order, {"random_seed": seed})


def random_group_plan(plan: Plan, cands: list[Candidate], seed: int) -> Plan:
    """Like `random_plan`, but whole tensors at a time: all candidates of a tensor (every
    expert's) are taken together when they fit, in a seeded random order of the tensors."""
    groups: dict[str, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(c.tensor, []).append(c)
    names = sorted(groups)
    random.Random(seed).shuffle(names)
    target, spent, order = plan.planned_expert_bytes, 0, []
    for n in names:
        cost = sum(c.nbytes for c in groups[n]) + sum(
            {(c.model, c.tensor): c.lora_a_nbytes for c in groups[n]}.values())
        if spent + cost <= target:
            order += groups[n]
            spent += cost
    return _first_fit(plan, cands, order, {"random_group_seed": seed})


def expert_normalized_plan(plan: Plan, cands: list[Candidate]) -> Plan:
    """A plan of the same bytes ranked by utility / (the expert's total utility) per byte: every
    expert keeps about the same share of its own delta (a diagnostic, not the product's rule)."""
    totals: dict[str, float] = {}
    for c in cands:
        totals[c.model] = totals.get(c.model, 0.0) + c.utility
    order = sorted(cands, key=lambda c: -c.utility / (totals[c.model] or 1.0) / c.nbytes)
    return _first_fit(plan, cands, order, {"order": "expert-normalized utility"})


def _first_fit(plan: Plan, cands: list[Candidate], order: list[Candidate],
               tag: dict[str, object]) -> Plan:
    """Take candidates in `order` while they fit in plan.planned_expert_bytes."""
    target = plan.planned_expert_bytes
    chosen: list[Candidate] = []
    touched: set[tuple[str, str]] = set()
    spent = 0
    for c in order:
        cost = c.nbytes + (0 if (c.model, c.tensor) in touched else c.lora_a_nbytes)
        if spent + cost <= target:
            chosen.append(c)
            touched.add((c.model, c.tensor))
            spent += cost
    keys = {(c.model, c.tensor, c.block_index) for c in chosen}
    omitted = sum(c.utility for c in cands if (c.model, c.tensor, c.block_index) not in keys)
    per_block: dict[tuple[str, int], float] = {}  # omission_bound_l2: blocks in quadrature
    for c in cands:
        if (c.model, c.tensor, c.block_index) not in keys:
            per_block[(c.tensor, c.block_index)] = per_block.get((c.tensor, c.block_index),
                                                                 0.0) + c.utility
    omitted_l2 = min(math.sqrt(math.fsum(v * v for v in per_block.values())), omitted)
    blocks = [PlannedBlock(c.model, c.tensor, c.block_index, c.nbytes, c.utility, rank)
              for rank, c in enumerate(chosen)]
    digest = hashlib.sha256(json.dumps(
        {"base_plan": plan.plan_hash, **tag,
         "blocks": sorted([b.model, b.tensor, b.block_index] for b in blocks)}).encode()
    ).hexdigest()
    additive = plan.request.spec.additive and plan.omission_bound is not None
    return replace(plan, plan_hash=digest, planned_expert_bytes=spent, blocks=blocks,
                   omission_bound=omitted if additive else None,
                   omission_bound_l2=omitted_l2 if additive else None, experts=[],
                   omission_bound_note=None if additive else plan.omission_bound_note)


def retained_utility(plan: Plan) -> float:
    """Sum of the utilities of a plan's blocks."""
    return sum(b.utility for b in plan.blocks)
