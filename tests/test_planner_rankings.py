"""The rankings other than l2 (coverage, stratified, tensor_energy, region_energy) on a seeded factory
family: deterministic, budget-sound, the standard merge at full budget, and the additive
omission bounds hold on the executed merge whatever the order."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mergepipe.catalog.db import Catalog
from mergepipe.core.operators.registry import REGISTRY
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import execute_plan
from mergepipe.planner.plan import Plan, make_plan
from tests import factory
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

RANKINGS = ("coverage", "stratified", "tensor_energy", "region_energy")
EXPERTS = "e0:1.0,e1:0.5,e2:2.0"


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Catalog, Path]]:
    root = Path(tmp_path_factory.mktemp("rankings"))
    cat = Catalog(new_catalog(root))
    ingest_family(cat, root / "fam", kinds=("full", "full", "full"), dtype="F32", seed=7)
    yield cat, root
    cat.close()


def _plan(cat: Catalog, op: str, budget: float, utility: str | None, **params: object) -> Plan:
    if utility is not None:
        params["utility"] = utility
    return make_plan(cat, build_request(base="base", experts=EXPERTS, operator=op,
                                        params=params, budget=budget, output_dtype="F32"))


def _l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(((a[n].double() - b[n].double()) ** 2).sum()) for n in a))


@pytest.mark.parametrize("utility", RANKINGS)
@pytest.mark.parametrize("op", ["linear", "task_arithmetic"])
def test_additive_bounds_hold_and_plans_are_sound(fam: tuple[Catalog, Path], op: str,
                                                  utility: str) -> None:
    cat, root = fam
    full = execute_plan(cat, _plan(cat, op, 1.0, utility), root / f"{op}-{utility}-full")
    m_full = factory.load(Path(full.output))
    # full budget: the standard merge (the default ranking's full read, same output bytes)
    ref = execute_plan(cat, _plan(cat, op, 1.0, "l2"), root / f"{op}-ref", overwrite=True)
    assert _l2(m_full, factory.load(Path(ref.output))) == 0.0
    scale = math.sqrt(sum(float((t.double() ** 2).sum()) for t in m_full.values()))
    planned = []
    for budget in (0.1, 0.4, 0.7):
        p = _plan(cat, op, budget, utility)
        assert _plan(cat, op, budget, utility).plan_hash == p.plan_hash  # deterministic
        assert p.planned_expert_bytes <= p.budget_bytes
        r = execute_plan(cat, p, root / f"{op}-{utility}-{budget}")
        assert r.expert_bytes_read == p.planned_expert_bytes
        assert p.omission_bound is not None and p.omission_bound_l2 is not None
        omitted = math.fsum(b.utility for b in _plan(cat, op, 1.0, utility).blocks) - math.fsum(
            b.utility for b in p.blocks)
        assert p.omission_bound == pytest.approx(omitted, rel=1e-9, abs=1e-9)
        deviation = _l2(m_full, factory.load(Path(r.output)))
        assert 0 < deviation <= p.omission_bound_l2 + 1e-6 * scale
        assert p.omission_bound_l2 <= p.omission_bound
        planned.append(p.planned_expert_bytes)
    assert planned == sorted(planned)


@pytest.mark.parametrize("utility", RANKINGS)
@pytest.mark.parametrize(("op", "params"), [("ties", {"density": 0.5}),
                                            ("dare_ties", {"density": 0.5}),
                                            ("della", {"density": 0.5})])
def test_sparse_operators_full_budget_is_the_standard_merge(fam: tuple[Catalog, Path], op: str,
                                                            params: dict[str, object],
                                                            utility: str) -> None:
    cat, root = fam
    p = _plan(cat, op, 1.0, utility, **params)
    ref = _plan(cat, op, 1.0, "l2", **params)
    assert p.planned_expert_bytes == ref.planned_expert_bytes == ref.full_read_bytes
    a = execute_plan(cat, p, root / f"{op}-{utility}")
    b = execute_plan(cat, ref, root / f"{op}-l2", overwrite=True)
    assert _l2(factory.load(Path(a.output)), factory.load(Path(b.output))) == 0.0
    small = _plan(cat, op, 0.3, utility, **params)
    assert small.planned_expert_bytes <= small.budget_bytes
    assert _plan(cat, op, 0.3, utility, **params).plan_hash == small.plan_hash


@pytest.mark.parametrize(("op", "params", "utility", "unit"), [
    ("linear", {}, "per_tensor", "expert_block"),
    ("task_arithmetic", {}, "auto", "expert_block"),
    ("breadcrumbs_ties", {"density": 0.5}, "auto", "expert_block"),
    ("ties", {"density": 0.5}, "auto", "expert_block"),
    ("dare_ties", {"density": 0.5}, "auto", "expert_block"),
    ("della", {"density": 0.5}, "auto", "expert_block")])
def test_default_ranking_per_operator(fam: tuple[Catalog, Path], op: str,
                                      params: dict[str, object], utility: str,
                                      unit: str) -> None:
    # the defaults of the fidelity study (docs/FIDELITY.md, "The regime rule"): a request
    # without utility plans exactly what the explicit ranking and unit plan (auto: the ranking
    # it chose, which the plan reports)
    cat, _ = fam
    default = _plan(cat, op, 0.3, None, **params)
    assert REGISTRY[op].default_utility == utility
    assert (default.ranking is not None) == (utility == "auto")
    if default.ranking is not None:
        assert default.ranking["utility"] in REGISTRY[op].auto_utility
        utility = default.ranking["utility"]
    explicit = _plan(cat, op, 0.3, utility, unit=unit, **params)
    assert default.unit == unit
    assert [(b.model, b.tensor, b.block_index) for b in default.blocks] == [
        (b.model, b.tensor, b.block_index) for b in explicit.blocks]
    # an explicit ranking other than the default is stored in the request: another hash
    assert (default.plan_hash == explicit.plan_hash) == (default.ranking is None)
    others = [u for u in ("l2", "per_tensor", "stratified") if u != utility]
    assert any(_plan(cat, op, 0.3, u, unit=unit, **params).plan_hash != default.plan_hash
               for u in others)


def test_operator_listing_gives_each_operator_its_default_ranking() -> None:
    # GET /v1/operators (and the console, which sends the listed defaults) must show the spec's
    # ranking, not the parameter's global l2: else the console overrides every default
    from mergepipe.service.routes.operators import operator_out
    for op, utility in (("ties", "auto"), ("della", "auto"), ("linear", "per_tensor"),
                        ("task_arithmetic", "auto"), ("dare_ties", "auto"),
                        ("breadcrumbs_ties", "auto")):
        params = {p["name"]: p for p in operator_out(REGISTRY[op])["params"]}
        assert params["utility"]["default"] == utility
        assert params["unit"]["default"] == REGISTRY[op].planning_unit


def test_tensor_energy_order_hand_computed(catalog: Catalog) -> None:
    # 100-byte blocks, weights 1. Tensor A: e0 l2 3, 4; e1 1, 1 -> E_A = 9 + 16 + 1 + 1 = 27.
    # Tensor B: e0 .1, .2; e1 .2, .1 -> E_B = .1. Scores a^2 / E_t: A/e0/1 16/27 = .593,
    # B/e0/1 = B/e1/0 = .04/.1 = .4, A/e0/0 9/27 = .333, B/e0/0 = B/e1/1 = .1, A/e1 1/27 = .037
    # (equal scores: l2 order, then expert position). l2 takes A's blocks first.
    shapes = [Ten("A", [Blk(100), Blk(100)]), Ten("B", [Blk(100), Blk(100)])]
    add_model(catalog, base_like("base", shapes))
    for name, a, b in (("e0", (3, 4), (.1, .2)), ("e1", (1, 1), (.2, .1))):
        add_model(catalog, Model(name, [Ten("A", [Blk(100, x) for x in a]),
                                         Ten("B", [Blk(100, x) for x in b])], base="base"))

    def blocks(utility: str, budget: str) -> list[tuple[str, str, int]]:
        p = make_plan(catalog, build_request(base="base", experts="e0,e1",
                                             operator="task_arithmetic", budget=budget,
                                             params={"utility": utility}))
        return [(b.model, b.tensor, b.block_index) for b in p.blocks]

    order = [("e0", "A", 1), ("e0", "B", 1), ("e1", "B", 0), ("e0", "A", 0), ("e0", "B", 0),
             ("e1", "B", 1), ("e1", "A", 0), ("e1", "A", 1)]
    for k in range(1, 9):
        assert sorted(blocks("tensor_energy", f"{100 * k}B")) == sorted(order[:k])
    assert sorted(blocks("l2", "300B")) == sorted([("e0", "A", 1), ("e0", "A", 0), ("e1", "A", 0)])


def test_region_energy_order_hand_computed(catalog: Catalog) -> None:
    # 100-byte blocks, weights 1, della (density 0.5). Tensor A: e0 l2 3, 1; e1 2, 1 ->
    # E_A = 9 + 1 + 4 + 1 = 15. Tensor B: e0 .2, .1; e1 .1, .1 -> E_B = .07. Score a^2 / E_t
    # times sqrt(k) - sqrt(k - 1), k the expert's rank by a in its region (tensor, block; equal
    # a: the l2 order, e0 first): A0 e0 9/15 = .6, e1 4/15 * .414 = .110; A1 e0 1/15 = .0667,
    # e1 .0276; B0 e0 .04/.07 = .571, e1 .01/.07 * .414 = .0592; B1 e0 .143, e1 .0592.
    # stratified (share of the (expert, tensor) delta) takes B1/e1 third, tensor_energy A0/e1,
    # l2 A0/e1 second.
    shapes = [Ten("A", [Blk(100), Blk(100)]), Ten("B", [Blk(100), Blk(100)])]
    add_model(catalog, base_like("base", shapes))
    for name, a, b in (("e0", (3, 1), (.2, .1)), ("e1", (2, 1), (.1, .1))):
        add_model(catalog, Model(name, [Ten("A", [Blk(100, x) for x in a]),
                                         Ten("B", [Blk(100, x) for x in b])], base="base"))

    def blocks(utility: str | None, budget: str) -> list[tuple[str, str, int]]:
        params: dict[str, object] = {"density": 0.5}
        if utility is not None:
            params["utility"] = utility
        p = make_plan(catalog, build_request(base="base", experts="e0,e1", operator="della",
                                             budget=budget, params=params))
        return [(b.model, b.tensor, b.block_index) for b in p.blocks]

    order = [("e0", "A", 0), ("e0", "B", 0), ("e0", "B", 1), ("e1", "A", 0), ("e0", "A", 1),
             ("e1", "B", 0), ("e1", "B", 1), ("e1", "A", 1)]
    for k in range(1, 9):
        assert sorted(blocks("region_energy", f"{100 * k}B")) == sorted(order[:k])
    assert ("e1", "B", 1) in blocks("stratified", "300B")
    assert ("e1", "A", 0) in blocks("tensor_energy", "300B")
    assert ("e1", "A", 0) in blocks("l2", "200B")
