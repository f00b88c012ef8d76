"""Planner: hand-computed access sets on tiny catalogs with known block sizes and statistics."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Conflict, InvalidRequest, NotFound
from mergepipe.core.request import Budget, build_request
from mergepipe.planner.plan import Plan, TrimThreshold, make_plan
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

# Three experts, two tensors. Block sizes 100 bytes except the 40-byte last block of t1.
# task_arithmetic (alpha = w): utility per byte, in rank order (ties by position, ordinal, block):
#   1 e0.t0.0  4/100  =.04    5 e2.t1.1  2*.5/40 =.025   9 e2.t0.2  .02    13 e1.t0.2 .01
#   2 e1.t1.1 .5*3/40 =.0375  6 e0.t1.0  2/100   =.02    10 e2.t1.0 .02
#   3 e1.t0.0 .5*6/100=.03    7 e2.t0.0  2*1/100 =.02    11 e0.t0.2 .01
#   4 e0.t1.1  1/40   =.025   8 e2.t0.1  .02             12 e1.t0.1 .01
# Zero deltas (e0.t0.1, e1.t1.0) are never candidates. C_full = 10 x 100 + 3 x 40 = 1120.
E0 = [Ten("t0", [Blk(100, 4), Blk(100, 0), Blk(100, 1)]), Ten("t1", [Blk(100, 2), Blk(40, 1)])]
E1 = [Ten("t0", [Blk(100, 6), Blk(100, 2), Blk(100, 2)]), Ten("t1", [Blk(100, 0), Blk(40, 3)])]
E2 = [Ten("t0", [Blk(100, 1), Blk(100, 1), Blk(100, 1)]), Ten("t1", [Blk(100, 1), Blk(40, .5)])]
RANKED = [("e0", "t0", 0), ("e1", "t1", 1), ("e1", "t0", 0), ("e0", "t1", 1), ("e2", "t1", 1),
          ("e0", "t1", 0), ("e2", "t0", 0), ("e2", "t0", 1), ("e2", "t0", 2), ("e2", "t1", 0),
          ("e0", "t0", 2), ("e1", "t0", 1), ("e1", "t0", 2)]
UTILITY = {("e0", "t0", 0): 4, ("e0", "t0", 2): 1, ("e0", "t1", 0): 2, ("e0", "t1", 1): 1,
           ("e1", "t0", 0): 3, ("e1", "t0", 1): 1, ("e1", "t0", 2): 1, ("e1", "t1", 1): 1.5,
           ("e2", "t0", 0): 2, ("e2", "t0", 1): 2, ("e2", "t0", 2): 2, ("e2", "t1", 0): 2,
           ("e2", "t1", 1): 1}
TOTAL_UTILITY = sum(UTILITY.values())  # 23.5


@pytest.fixture
def cat(catalog: Catalog) -> Catalog:
    add_model(catalog, base_like("B", E0))
    for name, tensors in (("e0", E0), ("e1", E1), ("e2", E2)):
        add_model(catalog, Model(name, tensors, base="B"))
    return catalog


def plan(cat: Catalog, budget: str | float | dict[str, Any] | Budget | None = None,
         op: str = "task_arithmetic",
         experts: str = "e0,e1:0.5,e2:2", **params: object) -> Plan:
    # The hand-computed orders of this file rank by l2, the additive operators' default before
    # issue 31 (now per_tensor): it is asked for explicitly; utility=None: the default.
    if op in ("linear", "task_arithmetic"):
        params.setdefault("utility", "l2")
    if params.get("utility", "") is None:
        del params["utility"]
    return make_plan(cat, build_request(base="B", experts=experts, operator=op,
                                        params=params, budget=budget))


def keys(p: Plan) -> list[tuple[str, str, int]]:
    return [(b.model, b.tensor, b.block_index) for b in p.blocks]


def test_full_budget_selects_every_candidate_in_rank_order(cat: Catalog) -> None:
    p = plan(cat)
    assert keys(p) == RANKED
    assert [b.rank for b in p.blocks] == list(range(13))
    assert p.full_read_bytes == p.planned_expert_bytes == p.budget_bytes == 1120
    assert p.candidate_blocks == 13 and p.omission_bound == 0.0
    assert [b.utility for b in p.blocks] == [UTILITY[k] for k in RANKED]
    assert p.selected()[("e0", "t0")] == {0, 2}  # the zero-delta block 1 is not read
    assert ("e1", "t1", 0) not in keys(p)


def test_prefix_then_leftover_fill(cat: Catalog) -> None:
    # 100 + 40 fit (140); rank 3 (100) would make 240 > 200; the fill takes rank 4 (40) -> 180;
    # rank 5 (40) would make 220. Bound = 23.5 - (4 + 1.5 + 1).
    p = plan(cat, "200B")
    assert keys(p) == [RANKED[0], RANKED[1], RANKED[3]]
    assert p.budget_bytes == 200 and p.planned_expert_bytes == 180
    assert p.omission_bound == pytest.approx(TOTAL_UTILITY - 6.5)
    assert p.touched_ratio == pytest.approx(180 / 1120)
    by = {e.model: e for e in p.experts}
    assert (by["e0"].planned_bytes, by["e1"].planned_bytes, by["e2"].planned_bytes) == (140, 40, 0)
    assert (by["e0"].selected_blocks, by["e0"].candidate_blocks) == (2, 4)
    assert by["e2"].full_read_bytes == 440


@pytest.mark.parametrize(("budget", "n_prefix", "planned"), [
    ("280B", 4, 280), ("330B", 5, 320), ("1119B", 12, 1020)])
def test_prefix_budgets(cat: Catalog, budget: str, n_prefix: int, planned: int) -> None:
    p = plan(cat, budget)
    assert keys(p) == RANKED[:n_prefix] and p.planned_expert_bytes == planned


def test_fraction_budget_is_of_the_full_read(cat: Catalog) -> None:
    p = plan(cat, 0.25)  # floor(0.25 * 1120) = 280
    assert p.budget_bytes == 280 and keys(p) == RANKED[:4]
    assert plan(cat, 1.0).planned_expert_bytes == 1120  # the full read: everything
    with pytest.raises(InvalidRequest, match="budget.fraction"):
        plan(cat, 2.0)  # a share of the full read: above 1 means nothing (it read everything)


def test_zero_resolved_budget_reads_nothing(cat: Catalog) -> None:
    p = plan(cat, Budget(fraction=1e-6))  # floor(0.00112) = 0 bytes
    assert p.budget_bytes == 0 and p.blocks == [] and p.planned_expert_bytes == 0
    assert p.omission_bound == pytest.approx(TOTAL_UTILITY)
    assert p.summary()["touched_ratio"] == 0.0


def test_linear_coefficients_scale_the_bound_not_the_order(cat: Catalog) -> None:
    p = plan(cat, "200B", op="linear")  # alpha = w / 3.5
    assert keys(p) == [RANKED[0], RANKED[1], RANKED[3]]
    assert p.omission_bound == pytest.approx((TOTAL_UTILITY - 6.5) / 3.5)
    assert [e.coefficient for e in p.experts] == pytest.approx([1 / 3.5, .5 / 3.5, 2 / 3.5])


def test_linear_renormalize_selected_has_no_bound(cat: Catalog) -> None:
    p = plan(cat, "200B", op="linear", renormalize="selected")
    assert p.omission_bound is None and "renormalize" in (p.omission_bound_note or "")


@pytest.mark.parametrize("op", ["ties", "dare_linear", "dare_ties"])
def test_sparse_operators_report_no_bound(cat: Catalog, op: str) -> None:
    p = plan(cat, "200B", op=op, density=0.5)
    assert p.omission_bound is None and op in (p.omission_bound_note or "")
    assert p.planned_expert_bytes <= 200


def test_weight_zero_expert_is_never_read(cat: Catalog) -> None:
    p = plan(cat, experts="e0,e1:0,e2")
    assert {b.model for b in p.blocks} == {"e0", "e2"}
    assert p.experts[1].candidate_blocks == 0 and p.experts[1].planned_bytes == 0


def test_negative_weight_ranks_by_magnitude(cat: Catalog) -> None:
    assert keys(plan(cat, experts="e0,e1:-0.5,e2:-2")) == RANKED


def test_ties_threshold_excludes_blocks_below_tau(catalog: Catalog) -> None:
    # tau grows as density falls: tau[j] for density (j+1)/100 is 1 - j/100.
    taus = [1 - j / 100 for j in range(100)]
    e = [Ten("t0", [Blk(100, 5, max_abs=0.4), Blk(100, 5, max_abs=0.5), Blk(100, 1, max_abs=0.9)],
             tau=taus, above=list(range(100)), tied=[2] * 100),
         Ten("t1", [Blk(100, 1, max_abs=0.2)], tau=taus)]
    add_model(catalog, base_like("B", e))
    add_model(catalog, Model("x", e, base="B"))

    def ties(density: float) -> Plan:
        return make_plan(catalog, build_request(base="B", experts="x", operator="ties",
                                                params={"density": density}))
    # density 0.5: tau = 0.51 -> only the block with max 0.9; 0.51: tau = 0.5 (tied block kept).
    assert keys(ties(0.5)) == [("x", "t0", 2)] and ties(0.5).full_read_bytes == 100
    assert sorted(keys(ties(0.51))) == [("x", "t0", 1), ("x", "t0", 2)]
    assert ties(0.9).full_read_bytes == 400  # tau = 0.11: every block
    p = ties(0.5)
    assert p.trims[("x", "t0")] == TrimThreshold(tau=0.51, above=49, tied=2, k=int(0.5 * 150))
    # dare_ties has no catalog trim: every nonzero block is a candidate.
    p = make_plan(catalog, build_request(base="B", experts="x", operator="dare_ties",
                                         params={"density": 0.5}))
    assert p.full_read_bytes == 400 and p.trims == {}


def test_ties_density_zero_keep_count_excludes_the_tensor(catalog: Catalog) -> None:
    # A catalog ingested before mergekit's k floor stored tau = +inf where int(0.01 * numel) = 0:
    # nothing of the tensor can survive the trim (ingestion now stores the k = 1 threshold).
    e = [Ten("t0", [Blk(100, 5)], tau=[math.inf] + [0.0] * 99), Ten("t1", [Blk(100, 1)])]
    add_model(catalog, base_like("B", e))
    add_model(catalog, Model("x", e, base="B"))
    p = make_plan(catalog, build_request(base="B", experts="x:1:0.01", operator="ties"))
    assert keys(p) == [("x", "t1", 0)]
    assert p.trims[("x", "t0")].tau == math.inf and p.trims[("x", "t0")].k == 1


def test_lora_a_is_charged_once_per_touched_tensor(catalog: Catalog) -> None:
    # Utility per byte: t0.0 .1, t0.1 .08, t1.0 .06, t0.2 .002. lora_A: t0 30 bytes, t1 20.
    lora = [Ten("t0", [Blk(50, 5), Blk(50, 4), Blk(50, .1)], lora_a_nbytes=30),
            Ten("t1", [Blk(50, 3)], lora_a_nbytes=20)]
    add_model(catalog, base_like("B", lora))
    add_model(catalog, Model("L", lora, base="B", kind="lora", lora_scale=2.0))

    def at(budget: str) -> Plan:
        return make_plan(catalog, build_request(base="B", experts="L", operator="task_arithmetic",
                                                params={"utility": "l2"}, budget=budget))
    full = at("1GB")
    assert full.full_read_bytes == full.planned_expert_bytes == 200 + 30 + 20
    assert at("69B").blocks == [] and at("69B").planned_expert_bytes == 0
    # t0.0 costs 50 + 30 > 79; the fill takes t1.0 at 50 + 20.
    assert keys(at("79B")) == [("L", "t1", 0)] and at("79B").planned_expert_bytes == 70
    assert keys(at("80B")) == [("L", "t0", 0)] and at("80B").planned_expert_bytes == 80
    assert keys(at("130B")) == [("L", "t0", 0), ("L", "t0", 1)]
    # 130 + (50 + 20) > 199; the fill then finds t0.2 (50, lora_A already read) -> 180.
    p = at("199B")
    assert keys(p) == [("L", "t0", 0), ("L", "t0", 1), ("L", "t0", 2)]
    assert p.planned_expert_bytes == 180
    assert keys(at("200B")) == [("L", "t0", 0), ("L", "t0", 1), ("L", "t1", 0)]
    assert at("200B").planned_expert_bytes == 200


def test_fallback_expert_is_planned_as_whole_tensors_after_ranked_blocks(cat: Catalog) -> None:
    add_model(cat, Model("f", E1, base="B", has_stats=False))
    # e0's candidates (340 bytes) first, then f's tensors in checkpoint order: t0 (300), t1 (140).
    p = make_plan(cat, build_request(base="B", experts="e0,f", operator="linear",
                                     params={"utility": "l2"}, budget=f"{340 + 140}B"))
    assert keys(p)[:4] == [("e0", "t0", 0), ("e0", "t1", 1), ("e0", "t1", 0), ("e0", "t0", 2)]
    assert keys(p)[4:] == [("f", "t1", 0), ("f", "t1", 1)]  # t0 did not fit; t1 filled in
    assert p.planned_expert_bytes == 480 and p.full_read_bytes == 340 + 440
    assert p.fallback_experts == ["f"] and p.omission_bound is None
    s = p.summary()
    assert s["fallback_experts"] == ["f"] and "whole tensors" in s["fallback_order"]
    assert "no statistics for f" in s["omission_bound_note"]
    assert [b.utility for b in p.blocks[4:]] == [0.0, 0.0]
    assert all(type(b.utility) is float and type(b.nbytes) is int for b in p.blocks)
    # Fallback tensors include zero-delta blocks: without statistics nothing is known.
    assert make_plan(cat, build_request(base="B", experts="f", operator="linear")
                     ).full_read_bytes == 300 + 140


def test_fallback_tensors_interleave_experts_in_checkpoint_order(cat: Catalog) -> None:
    add_model(cat, Model("f", E1, base="B", has_stats=False))
    add_model(cat, Model("g", E2, base="B", has_stats=False))
    p = make_plan(cat, build_request(base="B", experts="g,f", operator="linear"))
    order = list(dict.fromkeys((b.model, b.tensor) for b in p.blocks))
    assert order == [("g", "t0"), ("f", "t0"), ("g", "t1"), ("f", "t1")]


def test_summary_keys_and_values(cat: Catalog) -> None:
    s = plan(cat, "200B").summary()
    assert {"plan_hash", "operator", "base", "experts", "budget_bytes", "full_read_bytes",
            "planned_expert_bytes", "touched_ratio", "selected_blocks", "candidate_blocks",
            "omission_bound", "fallback_experts", "planning_seconds"} <= set(s)
    assert (s["selected_blocks"], s["candidate_blocks"], s["budget"]) == (3, 13, {"bytes": 200})
    assert [e["planned_bytes"] for e in s["experts"]] == [140, 40, 0]
    assert (s["experts"][1]["model"], s["experts"][1]["weight"]) == ("e1", 0.5)
    assert 0 < s["planning_seconds"] < 10


def test_unknown_models_are_named(cat: Catalog) -> None:
    with pytest.raises(NotFound, match="base model 'nobase'"):
        make_plan(cat, build_request(base="nobase", experts="e0", operator="linear"))
    with pytest.raises(NotFound, match="expert model 'ghost'") as e:
        plan(cat, experts="e0,ghost")
    assert e.value.field == "experts[1].model"


def test_experts_must_share_the_base(cat: Catalog) -> None:
    add_model(cat, base_like("B2", E0))
    add_model(cat, Model("other", E0, base="B2"))
    with pytest.raises(InvalidRequest, match="'other' was derived from base 'B2'"):
        plan(cat, experts="e0,other")
    with pytest.raises(InvalidRequest, match="'B2' is registered as a base"):
        plan(cat, experts="e0,B2")
    add_model(cat, Model("L", E0, base="B", kind="lora"))
    with pytest.raises(InvalidRequest, match="a base must be a full checkpoint"):
        make_plan(cat, build_request(base="L", experts="e0", operator="linear"))


@pytest.mark.parametrize(("status", "error"), [("ingesting", None), ("failed", "disk on fire")])
def test_models_must_be_ready(cat: Catalog, status: str, error: str | None) -> None:
    add_model(cat, Model("late", E0, base="B", status=status, error=error))
    with pytest.raises(Conflict, match=f"'late' is {status}") as e:
        plan(cat, experts="e0,late")
    if error:
        assert error in e.value.message


def test_merged_output_of_the_same_base_is_an_expert(cat: Catalog) -> None:
    add_model(cat, Model("merged", E2, base="B", source_merge="m-123"))
    assert keys(plan(cat, experts="e0,e1:0.5,merged:2")) == [
        ("merged" if m == "e2" else m, t, b) for m, t, b in RANKED]


def test_missing_statistics_are_refused(catalog: Catalog) -> None:
    add_model(catalog, base_like("B", E0))
    add_model(catalog, Model("e0", E0, base="B"))
    catalog.execute(SQL(
        "DELETE FROM block_stats WHERE model = 'e0' AND tensor = 't1' AND block_index = 0"))
    with pytest.raises(InvalidRequest, match="'e0' .* no block_stats rows for tensor 't1'"):
        make_plan(catalog, build_request(base="B", experts="e0", operator="linear"))



def test_concurrent_plans_do_not_share_state(cat: Catalog) -> None:
    # Each plan uses its own connection and temp tables: parallel plans of different requests
    # (as the service runs them) give the same results as sequential ones.
    from concurrent.futures import ThreadPoolExecutor
    budgets: list[str | float] = ["200B", "330B", 1.0, "40B"] * 3
    expected = {str(b): keys(plan(cat, b)) for b in budgets}
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda b: (str(b), keys(plan(cat, b))), budgets))
    assert all(expected[b] == k for b, k in got)


# omission_bound_l2: per (tensor, block), sum the omitted utilities over experts, then the L2
# norm over (tensor, block). At 200B (selected e0.t0.0, e1.t1.1, e0.t1.1) the omitted units are
#   t0.0: e1 3 + e2 2 = 5    t0.1: e1 1 + e2 2 = 3    t0.2: e0 1 + e1 1 + e2 2 = 4
#   t1.0: e0 2 + e2 2 = 4    t1.1: e2 1
# -> sqrt(25 + 9 + 16 + 16 + 1) = sqrt(67), against omission_bound = 5 + 3 + 4 + 4 + 1 = 17.
# Nothing read: t0.0 9, t0.1 3, t0.2 4, t1.0 4, t1.1 3.5 -> sqrt(134.25) (omission_bound 23.5).
@pytest.mark.parametrize(("budget", "l2", "l1"), [
    ("200B", math.sqrt(67), 17.0), (Budget(fraction=1e-6), math.sqrt(134.25), TOTAL_UTILITY),
    (None, 0.0, 0.0)])
def test_omission_bound_l2_hand_computed(cat: Catalog, budget: str | Budget | None, l2: float,
                                         l1: float) -> None:
    p = plan(cat, budget)
    assert p.omission_bound == pytest.approx(l1)
    assert p.omission_bound_l2 == pytest.approx(l2, rel=1e-12, abs=1e-12)
    assert p.omission_bound_l2 is not None and p.omission_bound is not None
    assert p.omission_bound_l2 <= p.omission_bound
    assert p.summary()["omission_bound_l2"] == p.omission_bound_l2


def test_omission_bound_l2_scales_with_linear_coefficients(cat: Catalog) -> None:
    assert plan(cat, "200B", op="linear").omission_bound_l2 == pytest.approx(
        math.sqrt(67) / 3.5)


@pytest.mark.parametrize("params", [{"op": "ties", "density": 0.5},
                                    {"op": "linear", "renormalize": "selected"}])
def test_omission_bound_l2_absent_where_the_bound_is(cat: Catalog,
                                                    params: dict[str, object]) -> None:
    p = plan(cat, "200B", **params)  # type: ignore[arg-type]
    assert p.omission_bound is None and p.omission_bound_l2 is None
    assert p.summary()["omission_bound_l2"] is None


def test_omission_bound_l2_absent_with_a_fallback_expert(cat: Catalog) -> None:
    add_model(cat, Model("f", E1, base="B", has_stats=False))
    p = make_plan(cat, build_request(base="B", experts="e0,f", operator="linear", budget="200B"))
    assert p.omission_bound is None and p.omission_bound_l2 is None


# params.utility = per_tensor: score per byte = |alpha_i| * ||D_itb|| / ||D_it|| / nbytes.
# Tensor delta L2: e0.t0 sqrt(17), e0.t1 sqrt(5), e1.t0 sqrt(44), e1.t1 3, e2.t0 sqrt(3),
# e2.t1 sqrt(1.25). Scores (x 1e-3):
#   e2.t1.1 2*.5/1.118/40 = 22.36   e2.t0.* 2/1.732/100 = 11.55   e1.t0.0 .5*6/6.633/100 = 4.52
#   e2.t1.0 2/1.118/100   = 17.89   e0.t1.1 1/2.236/40  = 11.18   e0.t0.2 1/4.123/100 = 2.43
#   e1.t1.1 .5*3/3/40     = 12.5    e0.t0.0 4/4.123/100 = 9.70    e1.t0.1, e1.t0.2 1/6.633/100
#                                   e0.t1.0 2/2.236/100 = 8.94      = 1.51
RANKED_PER_TENSOR = [
    ("e2", "t1", 1), ("e2", "t1", 0), ("e1", "t1", 1), ("e2", "t0", 0), ("e2", "t0", 1),
    ("e2", "t0", 2), ("e0", "t1", 1), ("e0", "t0", 0), ("e0", "t1", 0), ("e1", "t0", 0),
    ("e0", "t0", 2), ("e1", "t0", 1), ("e1", "t0", 2)]


def test_per_tensor_utility_ranks_by_share_of_the_tensor_delta(cat: Catalog) -> None:
    p = plan(cat, utility="per_tensor")
    assert keys(p) == RANKED_PER_TENSOR
    # Full budget: the same blocks and bytes as the default ranking, nothing omitted.
    assert sorted(keys(p)) == sorted(RANKED) and p.planned_expert_bytes == 1120
    assert p.omission_bound == 0.0 and p.omission_bound_l2 == 0.0
    # Block utilities and the bounds keep the DESIGN definition |alpha_i| * ||D_itb||.
    assert [b.utility for b in p.blocks] == [UTILITY[k] for k in RANKED_PER_TENSOR]


def test_per_tensor_utility_under_a_budget(cat: Catalog) -> None:
    # 40 + 100 + 40 = 180; e2.t0.0 (100) would make 280 > 200; no unit fits the 20 left.
    p = plan(cat, "200B", utility="per_tensor")
    assert keys(p) == RANKED_PER_TENSOR[:3] and p.planned_expert_bytes == 180
    # retained 1 + 2 + 1.5: less than the default plan's 6.5 (which maximizes it)
    assert p.omission_bound == pytest.approx(TOTAL_UTILITY - 4.5)
    # task_arithmetic's default is auto: an explicit ranking is stored in the request (and its
    # hash), whichever auto would choose
    assert p.summary()["params"]["utility"] == "per_tensor"
    assert plan(cat, "200B", utility="tensor_energy").summary()["params"]["utility"] == "tensor_energy"
    assert plan(cat, "200B", utility="l2").summary()["params"]["utility"] == "l2"


# params.utility = coverage / stratified: the per_tensor share times sqrt(k) - sqrt(k - 1),
# k the block's rank by share within its (expert, tensor) / its region (tensor, block) over
# experts (ties by the per_tensor rank); score per byte (x 1e-3), from the shares above:
#   coverage:   e2.t1.0 1.789/100 = 17.89   e2.t1.1 .894*.4142/40 = 9.26  e1.t0.0 4.52
#               e1.t1.1 .5/40     = 12.5    e0.t1.0 .894/100     = 8.94  e2.t0.2 1.155*.3178 = 3.67
#               e2.t0.0 1.155/100 = 11.55   e2.t0.1 1.155*.4142  = 4.78  e0.t0.2 .243*.4142 = 1.00
#               e0.t0.0 .970/100  = 9.70    e0.t1.1 .447*.4142/40 = 4.63 e1.t0.1 .62, e1.t0.2 .48
#   stratified: e2 leads every region (t1.1 22.36, t1.0 17.89, t0.* 11.55); then the second
#               experts: e1.t1.1 .5*.4142/40 = 5.18, e0.t0.0 .970*.4142 = 4.02, e0.t1.0 3.70;
#               the third: e0.t1.1 .447*.3178/40 = 3.55, e1.t0.0 .452*.3178 = 1.44; e0.t0.2 1.00,
#               e1.t0.1 .151*.4142 = .62, e1.t0.2 .151*.3178 = .48
RANKED_COVERAGE = [
    ("e2", "t1", 0), ("e1", "t1", 1), ("e2", "t0", 0), ("e0", "t0", 0), ("e2", "t1", 1),
    ("e0", "t1", 0), ("e2", "t0", 1), ("e0", "t1", 1), ("e1", "t0", 0), ("e2", "t0", 2),
    ("e0", "t0", 2), ("e1", "t0", 1), ("e1", "t0", 2)]
RANKED_STRATIFIED = [
    ("e2", "t1", 1), ("e2", "t1", 0), ("e2", "t0", 0), ("e2", "t0", 1), ("e2", "t0", 2),
    ("e1", "t1", 1), ("e0", "t0", 0), ("e0", "t1", 0), ("e0", "t1", 1), ("e1", "t0", 0),
    ("e0", "t0", 2), ("e1", "t0", 1), ("e1", "t0", 2)]


@pytest.mark.parametrize(("utility", "ranked"), [("coverage", RANKED_COVERAGE),
                                                 ("stratified", RANKED_STRATIFIED)])
def test_diminishing_rankings_order(cat: Catalog, utility: str,
                                    ranked: list[tuple[str, str, int]]) -> None:
    p = plan(cat, utility=utility)
    assert keys(p) == ranked
    assert p.planned_expert_bytes == 1120 and p.omission_bound == 0.0
    assert [b.utility for b in p.blocks] == [UTILITY[k] for k in ranked]  # bounds' utilities
    assert p.summary()["params"]["utility"] == utility


@pytest.mark.parametrize(("utility", "ranked", "n", "extra", "planned"), [
    # 100 + 40 + 100 = 240 > 200 after two; the fill takes e2.t1.1 (40): 180
    ("coverage", RANKED_COVERAGE, 2, [("e2", "t1", 1)], 180),
    # 40 + 100 = 140; then 100 > 60 left; the fill takes e1.t1.1 (40): 180
    ("stratified", RANKED_STRATIFIED, 2, [("e1", "t1", 1)], 180)])
def test_diminishing_rankings_under_a_budget(cat: Catalog, utility: str, ranked: list[Any],
                                             n: int, extra: list[Any], planned: int) -> None:
    p = plan(cat, "200B", utility=utility)
    assert keys(p) == ranked[:n] + extra and p.planned_expert_bytes == planned
    retained = sum(UTILITY[k] for k in keys(p))
    assert p.omission_bound == pytest.approx(TOTAL_UTILITY - retained)  # sound: omitted utility
    again = plan(cat, "200B", utility=utility)
    assert again.plan_hash == p.plan_hash  # deterministic


def test_coverage_gives_the_small_tensor_its_share(catalog: Catalog) -> None:
    # One expert, two tensors of 4 equal blocks, deltas 100x apart. l2 and per_tensor (equal
    # shares, ties by tensor order) spend 4 blocks on the big tensor; coverage alternates:
    # big.0, small.0 (share .5 each), big.1, small.1 (.5 * .4142), ...
    tensors = [Ten("big", [Blk(100, 100.0)] * 4), Ten("small", [Blk(100, 1.0)] * 4)]
    add_model(catalog, base_like("B", tensors))
    add_model(catalog, Model("e", tensors, base="B"))

    def p(utility: str) -> Plan:
        return make_plan(catalog, build_request(base="B", experts="e", operator="task_arithmetic",
                                                params={"utility": utility}, budget="400B"))
    assert {b.tensor for b in p("l2").blocks} == {"big"}
    assert {b.tensor for b in p("per_tensor").blocks} == {"big"}
    cov = p("coverage")
    assert [(b.tensor, b.block_index) for b in cov.blocks] == [
        ("big", 0), ("small", 0), ("big", 1), ("small", 1)]
    assert cov.omission_bound == pytest.approx(2 * 100 + 2 * 1)  # the omitted utilities


def test_utility_param_default_and_validation(cat: Catalog) -> None:
    # linear ranks per_tensor by default; task_arithmetic auto, which chooses per_tensor for
    # these experts' flat updates (delta spread: the median of e0's 0.115, e1's 0.203 and
    # e2's 0.028, under 0.22)
    for op, utility in (("task_arithmetic", "auto"), ("linear", "per_tensor")):
        default = plan(cat, "200B", op=op, utility=None)
        explicit = plan(cat, "200B", op=op, utility=utility)
        assert "utility" not in explicit.request.params  # the default is not stored: same hash
        assert explicit.plan_hash == default.plan_hash
        assert keys(default) == RANKED_PER_TENSOR[:3]
        for other in ("l2", "coverage", "tensor_energy"):
            assert plan(cat, "200B", op=op, utility=other).plan_hash != default.plan_hash
    with pytest.raises(InvalidRequest, match="utility"):
        plan(cat, "200B", utility="relative")


def test_per_tensor_utility_with_ties_keeps_the_candidate_set(cat: Catalog) -> None:
    a = plan(cat, op="ties", density=0.5)
    b = plan(cat, op="ties", density=0.5, utility="per_tensor")
    assert sorted(keys(a)) == sorted(keys(b)) and a.full_read_bytes == b.full_read_bytes
    assert a.trims == b.trims
