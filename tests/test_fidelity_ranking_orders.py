"""The ranking study's orders (mergepipe_bench.fidelity.ranking_study.rankings) are the planner's:
for every ranking the planner takes as `utility`, the first-fit of the study's order plans the
blocks the planner plans (the study checks this at run time too, on trained families; here on
seeded catalog rows). Equal expert weights, as in the study: its per_tensor divides a block's
utility by its (expert, tensor)'s, in which the weight cancels, where the planner divides by
the unweighted tensor norm."""

from __future__ import annotations

import random
from dataclasses import replace

from mergepipe_bench.fidelity.random_plan import _first_fit, candidates
from mergepipe_bench.fidelity.ranking_study import PLANNER_RANKINGS, rankings

from mergepipe.catalog.db import Catalog
from mergepipe.core.request import build_request
from mergepipe.planner.plan import Plan, make_plan
from tests.planner_rows import Blk, Model, Ten, add_model, base_like


def _family(cat: Catalog) -> None:
    """Base and three experts over 8 tensors of 2-5 blocks (in a 1-block tensor every share is 1:
    exact ties, which the study and the planner break differently); each tensor its own delta scale
    (1e-2 to 10), so the scale-free rankings and l2 disagree."""
    rng = random.Random(31)
    grid = [(f"t{t}", [rng.choice((64, 100, 128)) for _ in range(rng.randint(2, 5))],
             10 ** rng.uniform(-2, 1)) for t in range(8)]
    add_model(cat, base_like("base", [Ten(n, [Blk(b) for b in bs]) for n, bs, _ in grid]))
    for e in ("e0", "e1", "e2"):
        add_model(cat, Model(e, [Ten(n, [Blk(b, round(s * rng.uniform(0.05, 1), 6)) for b in bs])
                                 for n, bs, s in grid], base="base"))


def test_study_orders_plan_what_the_planner_plans(catalog: Catalog) -> None:
    _family(catalog)

    def plan(budget: float, utility: str | None = None) -> Plan:
        p: dict[str, object] = {"density": 0.5}
        if utility is not None:
            p["utility"] = utility
        return make_plan(catalog, build_request(base="base", experts="e0,e1,e2",
                                                operator="della", params=p, budget=budget))
    cands = candidates(catalog, plan(1.0))
    orders = rankings()
    assert "region_energy" in PLANNER_RANKINGS
    p = plan(0.3)
    cap = replace(p, planned_expert_bytes=p.budget_bytes)
    plans = set()
    for k in PLANNER_RANKINGS:
        ours = _first_fit(cap, cands, orders[k](cands), {"order": k})
        keys = sorted((b.model, b.tensor, b.block_index) for b in ours.blocks)
        assert keys == sorted((b.model, b.tensor, b.block_index)
                              for b in plan(0.3, k).blocks), k
        plans.add(tuple(keys))
    assert len(plans) == len(PLANNER_RANKINGS)  # every ranking plans other blocks here
