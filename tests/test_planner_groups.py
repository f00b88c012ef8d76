"""Planner, coherent groups: hand-computed group selection on a tiny catalog, budget soundness,
full-budget equality, whole groups only, the unit in the plan and in its hash."""

from __future__ import annotations

from typing import Any

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import REGISTRY
from mergepipe.core.request import build_request
from mergepipe.planner.plan import Plan, make_plan
from tests.planner_rows import Blk, Model, Ten, add_model, base_like
from tests.test_planner import E0, E1, E2, RANKED

# The catalog of tests/test_planner.py (weights e0:1, e1:0.5, e2:2; utility = w * l2):
#   tensor groups:  t0: e0 4+1, e1 3+1+1, e2 2+2+2 = 16 over 800 bytes = .02
#                   t1: e0 2+1, e1 1.5,   e2 2+1   = 7.5 over 320 bytes = .0234375 -> first
#   block groups:   t0.0 9/300 = .03, t1.1 3.5/120 = .0292, t1.0 4/200 = .02,
#                   t0.1 3/200 = .015, t0.2 4/300 = .0133 (in that order)
# Units inside a group: expert position, then block index. Zero deltas are never candidates.
T1 = [("e0", "t1", 0), ("e0", "t1", 1), ("e1", "t1", 1), ("e2", "t1", 0), ("e2", "t1", 1)]
T0 = [("e0", "t0", 0), ("e0", "t0", 2), ("e1", "t0", 0), ("e1", "t0", 1), ("e1", "t0", 2),
      ("e2", "t0", 0), ("e2", "t0", 1), ("e2", "t0", 2)]
B = {"t0.0": [("e0", "t0", 0), ("e1", "t0", 0), ("e2", "t0", 0)],
     "t1.1": [("e0", "t1", 1), ("e1", "t1", 1), ("e2", "t1", 1)],
     "t1.0": [("e0", "t1", 0), ("e2", "t1", 0)],
     "t0.1": [("e1", "t0", 1), ("e2", "t0", 1)],
     "t0.2": [("e0", "t0", 2), ("e1", "t0", 2), ("e2", "t0", 2)]}


@pytest.fixture
def cat(catalog: Catalog) -> Catalog:
    add_model(catalog, base_like("B", E0))
    for name, tensors in (("e0", E0), ("e1", E1), ("e2", E2)):
        add_model(catalog, Model(name, tensors, base="B"))
    return catalog


def plan(cat: Catalog, budget: str | float | dict[str, Any] | None = None,
         op: str = "task_arithmetic",
         experts: str = "e0,e1:0.5,e2:2", **params: object) -> Plan:
    # the hand-computed group orders rank by l2, the additive operators' default before
    # issue 31 (now per_tensor): asked for explicitly
    if op in ("linear", "task_arithmetic"):
        params.setdefault("utility", "l2")
    return make_plan(cat, build_request(base="B", experts=experts, operator=op,
                                        params=params, budget=budget))


def keys(p: Plan) -> list[tuple[str, str, int]]:
    return [(b.model, b.tensor, b.block_index) for b in p.blocks]


def test_operator_specs_declare_their_unit() -> None:
    for name in ("linear", "task_arithmetic", "dare_linear", "ties", "dare_ties"):
        assert REGISTRY[name].planning_unit == "expert_block"


@pytest.mark.parametrize(("budget", "expected", "planned"), [
    ("1120B", T1 + T0, 1120),   # full budget: every candidate, groups in order
    ("1119B", T1, 320),         # t0 (800 bytes) no longer fits after t1
    ("800B", T1, 320),          # greedy by group density: t1 first, then t0 does not fit
    ("320B", T1, 320),
    ("319B", [], 0),            # no group fits whole: nothing is read, never a partial group
])
def test_tensor_groups_hand_computed(cat: Catalog, budget: str, expected: list[object],
                                     planned: int) -> None:
    p = plan(cat, budget, unit="group")
    assert keys(p) == expected
    assert p.planned_expert_bytes == planned <= p.budget_bytes
    assert p.unit == "group" and p.summary()["unit_region"] == "tensor"
    # the additive bound still holds for any access set: the omitted units' utility
    assert p.omission_bound == pytest.approx(23.5 - sum(b.utility for b in p.blocks))


@pytest.mark.parametrize(("budget", "groups", "planned"), [
    ("500B", ["t0.0", "t1.1"], 420),           # t1.0 would make 620; nothing fits in 80
    ("700B", ["t0.0", "t1.1", "t1.0"], 620),
    ("250B", ["t1.1"], 120),                   # empty prefix (t0.0 is 300): the fill takes t1.1
    ("1120B", ["t0.0", "t1.1", "t1.0", "t0.1", "t0.2"], 1120),
])
def test_block_groups_hand_computed(cat: Catalog, budget: str, groups: list[str],
                                    planned: int) -> None:
    p = plan(cat, budget, unit="group_block")
    assert keys(p) == [k for g in groups for k in B[g]]
    assert p.planned_expert_bytes == planned
    assert p.summary()["unit"] == "group_block" and p.summary()["unit_region"] == "block"


def test_dare_ties_groups_are_coherent(cat: Catalog) -> None:
    full = plan(cat, op="dare_ties", density=0.5, unit="group")
    default = plan(cat, op="dare_ties", density=0.5)
    assert full.unit == "group" and default.unit == "expert_block"  # issue 31: (expert, block)
    assert sorted(keys(full)) == sorted(keys(default)) == sorted(RANKED)  # same reads at 1.0
    assert "unit" not in default.request.params and full.request.params["unit"] == "group"
    for op, params in (("dare_ties", {"unit": "group"}), ("ties", {"unit": "group"})):
        for budget in range(1, 1121, 97):
            p = plan(cat, f"{budget}B", op=op, density=0.5, **params)
            assert p.planned_expert_bytes <= p.budget_bytes == budget
            assert sum(b.nbytes for b in p.blocks) == p.planned_expert_bytes
            touched = {b.tensor for b in p.blocks}  # whole tensors: every candidate of each
            assert sorted(keys(p)) == sorted(k for k in RANKED if k[1] in touched)


def test_lora_a_is_charged_once_per_group_tensor(catalog: Catalog) -> None:
    ten = [Ten("t0", [Blk(100, 1), Blk(100, 1)], lora_a_nbytes=50),
           Ten("t1", [Blk(100, 3)], lora_a_nbytes=50)]
    add_model(catalog, base_like("B", ten))
    add_model(catalog, Model("a", ten, base="B", kind="lora", lora_scale=1.0))
    add_model(catalog, Model("f", [Ten("t0", [Blk(100, 1), Blk(100, 1)]),
                                   Ten("t1", [Blk(100, 3)])], base="B"))
    # groups: t1 (a: 3 + 50 of lora_A, f: 3) = 250 bytes first; t0 = 450 bytes
    full = make_plan(catalog, build_request(base="B", experts="a,f", operator="ties",
                                            params={"density": 0.5, "unit": "group"}))
    assert full.full_read_bytes == 700
    for budget, planned in ((249, 0), (250, 250), (699, 250), (700, 700)):
        p = make_plan(catalog, build_request(base="B", experts="a,f", operator="ties",
                                             params={"density": 0.5, "unit": "group"},
                                             budget=f"{budget}B"))
        assert p.planned_expert_bytes == planned


def test_unit_is_validated_and_hashed(cat: Catalog) -> None:
    with pytest.raises(InvalidRequest, match="unit"):
        plan(cat, unit="rows")
    # one expert: block groups and (expert, block) units give the same access set in the same
    # order, so only the unit in the hash tells the plans apart
    a = plan(cat, "300B", op="ties", experts="e0", density=0.5, unit="group_block")
    b = plan(cat, "300B", op="ties", experts="e0", density=0.5, unit="expert_block")
    assert keys(a) == keys(b) and a.plan_hash != b.plan_hash
    # additive operators: naming the default unit changes nothing, the hash included
    assert plan(cat, "300B", unit="expert_block").plan_hash == plan(cat, "300B").plan_hash
    assert plan(cat, "300B", unit="expert_block").summary()["unit"] == "expert_block"
