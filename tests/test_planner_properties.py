"""Planner properties over random tiny families (hypothesis), against a reference greedy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mergepipe.catalog.db import Catalog
from mergepipe.core.operators.spec import PLANNING_UNITS
from mergepipe.core.request import Budget, MergeRequest, build_request
from mergepipe.planner.plan import make_plan
from mergepipe.planner.weights import rank_weights
from tests.catalogs import new_catalog
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

_names = itertools.count()


@dataclass
class Family:
    base: str
    experts: list[Model]


@dataclass(frozen=True)
class Unit:
    """A candidate of the reference planner: one block, or a fallback expert's whole tensor."""

    key: tuple[int, int, int]  # (position, ordinal, block_index or -1)
    cost: int
    lora: int
    utility: float
    sort: tuple[object, ...]


@pytest.fixture(scope="module")
def shared_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    """One catalog for all examples: each family gets fresh model names."""
    cat = Catalog(new_catalog(Path(tmp_path_factory.mktemp("planner_props"))))
    yield cat
    cat.close()


@dataclass(frozen=True)
class Spec:
    """A random expert: per tensor and block l2 and max|delta|/l2, per tensor tau and lora_A."""

    l2: list[list[float]]
    ratio: list[list[float]]
    tau: list[float]
    lora: list[int] | None
    stats: bool
    weight: float


@st.composite
def families(draw: st.DrawFn) -> tuple[list[list[int]], list[Spec]]:
    grid = draw(st.lists(st.lists(st.integers(1, 120), min_size=1, max_size=4),
                         min_size=1, max_size=3))
    l2s = st.one_of(st.just(0.0), st.floats(0.01, 10.0, allow_nan=False))
    experts = []
    for _ in range(draw(st.integers(1, 3))):
        lora = draw(st.booleans()) and draw(st.integers(0, 4)) > 0
        experts.append(Spec(
            l2=[[draw(l2s) for _ in t] for t in grid],
            ratio=[[draw(st.floats(0.05, 1.0)) for _ in t] for t in grid],
            tau=[draw(st.floats(0.0, 3.0)) for _ in grid],
            lora=[draw(st.integers(1, 60)) for _ in grid] if lora else None,
            stats=draw(st.integers(0, 5)) > 0,
            weight=draw(st.sampled_from([1.0, 0.5, 2.0, -1.5, 0.25, 0.0]))))
    return grid, experts


def build(cat: Catalog, grid: list[list[int]], specs: list[Spec]) -> Family:
    n = next(_names)
    models = []
    for i, s in enumerate(specs):
        tensors = []
        for j, sizes in enumerate(grid):
            blocks = [Blk(nb, s.l2[j][b], s.l2[j][b] * s.ratio[j][b])
                      for b, nb in enumerate(sizes)]
            tensors.append(Ten(f"t{j}", blocks, None if s.lora is None else s.lora[j],
                               tau=s.tau[j]))
        models.append(Model(f"f{n}e{i}", tensors, base=f"f{n}b", has_stats=s.stats,
                            kind="lora" if s.lora is not None else "full"))
    add_model(cat, base_like(f"f{n}b", models[0].tensors))
    for m in models:
        add_model(cat, m)
    return Family(f"f{n}b", models)


def reference_units(fam: Family, req: MergeRequest) -> list[Unit]:
    """Candidates in rank order, computed in Python from the rows the test wrote."""
    weights = rank_weights(req)
    units = []
    for p, (m, w) in enumerate(zip(fam.experts, weights, strict=True)):
        if w == 0:
            continue
        for o, t in enumerate(m.tensors):
            lora = t.lora_a_nbytes or 0
            if not m.has_stats:
                units.append(Unit((p, o, -1), sum(b.nbytes for b in t.blocks), lora, 0.0,
                                  (1, 0.0, o, p, -1)))
                continue
            for bi, b in enumerate(t.blocks):
                u = w * b.l2
                tau = t.tau if req.operator == "ties" else None
                assert not isinstance(tau, list)
                if u > 0 and (tau is None or (b.max_abs or 0.0) >= tau):
                    units.append(Unit((p, o, bi), b.nbytes, lora, u, (0, -(u / b.nbytes), p, o, bi)))
    return sorted(units, key=lambda u: u.sort)


def reference_greedy(units: list[Unit], budget: int) -> tuple[list[Unit], int]:
    """Sequential greedy in rank order; lora_A once per touched (expert, tensor)."""
    touched: set[tuple[int, int]] = set()
    chosen, spent = [], 0
    for u in units:
        cost = u.cost + (0 if u.key[:2] in touched else u.lora)
        if spent + cost <= budget:
            chosen.append(u)
            spent += cost
            touched.add(u.key[:2])
    return chosen, spent


def reference_groups(units: list[Unit], region: str) -> list[list[Unit]]:
    """The units of the coherent-group planner, group by group: all experts' blocks of one
    tensor (or block) by summed utility per byte, then tensor name and block; inside a group by
    expert position and block; fallback units last, each its own group, in their order."""
    groups: dict[tuple[str, int], list[Unit]] = {}
    for u in units:
        if u.key[2] != -1:
            groups.setdefault((f"t{u.key[1]}", u.key[2] if region == "block" else -1),
                              []).append(u)
    order = sorted(groups, key=lambda g: (-(math.fsum(u.utility for u in groups[g])
                                            / sum(u.cost for u in groups[g])), g))
    return ([sorted(groups[g], key=lambda u: (u.key[0], u.key[2])) for g in order]
            + [[u] for u in units if u.key[2] == -1])


def reference_group_greedy(groups: list[list[Unit]], budget: int) -> tuple[list[Unit], int]:
    """Sequential greedy over whole groups; lora_A once per touched (expert, tensor)."""
    touched: set[tuple[int, int]] = set()
    chosen: list[Unit] = []
    spent = 0
    for g in groups:
        new = {u.key[:2]: u.lora for u in g if u.key[:2] not in touched}
        cost = sum(u.cost for u in g) + sum(new.values())
        if spent + cost <= budget:
            chosen += g
            spent += cost
            touched |= set(new)
    return chosen, spent


def plan_keys(fam: Family, plan_blocks: list[tuple[str, str, int]]) -> list[tuple[int, int, int]]:
    pos = {m.name: i for i, m in enumerate(fam.experts)}
    out: list[tuple[int, int, int]] = []
    for model, tensor, bi in plan_blocks:
        p, o = pos[model], int(tensor[1:])
        key = (p, o, -1) if not fam.experts[p].has_stats else (p, o, bi)
        if not out or out[-1] != key or key[2] != -1:
            out.append(key)
    return out


# the reference ranks by l2: asked for where the operator's default ranking is another
# (linear, task_arithmetic: per_tensor; ties: stratified)
OPS = st.sampled_from([("linear", {"utility": "l2"}),
                       ("task_arithmetic", {"lambda": 0.7, "utility": "l2"}),
                       ("ties", {"density": 0.3, "utility": "l2"}),
                       ("ties", {"density": 0.3, "unit": "group", "utility": "l2"}),
                       # whole-tensor groups, its default
                       ("dare_ties", {"density": 0.5, "utility": "l2"}),
                       ("dare_linear", {"density": 0.5}),
                       ("linear", {"normalize": False, "utility": "l2"}),
                       ("task_arithmetic", {"unit": "group_block", "utility": "l2"})])


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(family=families(), op=OPS, fractions=st.lists(st.floats(0.0, 1.2), min_size=1, max_size=3))
def test_plan_is_the_sound_monotone_greedy(shared_catalog: Catalog,
                                           family: tuple[list[list[int]], list[Spec]],
                                           op: tuple[str, dict[str, object]],
                                           fractions: list[float]) -> None:
    grid, specs = family
    # normalize with weights summing to zero is refused by request validation
    assume(sum(s.weight for s in specs) != 0)
    fam = build(shared_catalog, grid, specs)
    experts = ",".join(f"{m.name}:{s.weight}" for m, s in zip(fam.experts, specs, strict=True))

    def request(budget: Budget) -> MergeRequest:
        return build_request(base=fam.base, experts=experts, operator=op[0], params=op[1],
                             budget=budget)
    units = reference_units(fam, request(Budget(fraction=1.0)))
    region = PLANNING_UNITS[request(Budget(fraction=1.0)).planning_unit]
    if region is not None:  # coherent groups: the same candidates, selected group by group
        groups = reference_groups(units, region)
        units = [u for g in groups for u in g]

        def greedy(units: list[Unit], budget: int) -> tuple[list[Unit], int]:
            return reference_group_greedy(groups, budget)  # the groups hold the units
    else:
        def greedy(units: list[Unit], budget: int) -> tuple[list[Unit], int]:
            return reference_greedy(units, budget)
    full = make_plan(shared_catalog, request(Budget(fraction=1.0)))
    _, c_full = greedy(units, 10**12)
    # Full budget: every candidate, C_full bytes, nothing omitted.
    assert full.full_read_bytes == full.planned_expert_bytes == c_full
    assert plan_keys(fam, [(b.model, b.tensor, b.block_index) for b in full.blocks]) == \
        [u.key for u in units]
    if full.omission_bound is not None:
        assert full.omission_bound == 0.0
    budgets = sorted({math.floor(f * c_full) for f in fractions} | {max(c_full - 1, 0)})
    planned = []
    for b in budgets:
        p = make_plan(shared_catalog, request(Budget(bytes=b) if b > 0 else Budget(fraction=1e-12)))
        chosen, spent = greedy(units, b)
        assert p.budget_bytes == b
        assert p.planned_expert_bytes == spent <= b  # sound, and exactly the greedy
        assert plan_keys(fam, [(x.model, x.tensor, x.block_index) for x in p.blocks]) == \
            [u.key for u in chosen]
        assert sum(x.nbytes for x in p.blocks) + sum(
            {(x.model, x.tensor): fam.experts[int(x.model.split("e")[-1])].tensors[int(x.tensor[1:])]
             .lora_a_nbytes or 0 for x in p.blocks}.values()) == p.planned_expert_bytes
        if op[0] in ("linear", "task_arithmetic") and all(m.has_stats for m in fam.experts):
            omitted = [u.utility for u in units if u not in chosen]
            assert p.omission_bound == pytest.approx(math.fsum(omitted), rel=1e-9, abs=1e-12)
            per_block: dict[tuple[int, int], list[float]] = {}
            for u in units:
                if u not in chosen:  # experts share the grid: (tensor, block) = coordinates
                    per_block.setdefault(u.key[1:], []).append(u.utility)
            l2 = math.sqrt(math.fsum(math.fsum(v) ** 2 for v in per_block.values()))
            assert p.omission_bound_l2 == pytest.approx(l2, rel=1e-9, abs=1e-12)
            assert p.omission_bound_l2 is not None and p.omission_bound is not None
            assert p.omission_bound_l2 <= p.omission_bound
        else:
            assert p.omission_bound is None and p.omission_bound_l2 is None
        planned.append(p.planned_expert_bytes)
    assert planned == sorted(planned)  # more budget never plans fewer bytes
