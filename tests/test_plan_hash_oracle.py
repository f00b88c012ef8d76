"""Plan-hash oracle: making planning cheaper must not change a single plan.

Many requests (operators, budgets, utilities, planning units, weights, an expert without
statistics) are planned on a seeded catalog of rows; the sha256 over all their plan hashes and
access sets is pinned to the value the planner gave before the planning-cost work of issue 31.
On a real ingested family, the plan a merge records is the one make_plan gives for the request
(the merge's own checks before reading pin it and change nothing of it)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.operators.registry import REGISTRY
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge
from mergepipe.jobs.planning import check_inputs
from mergepipe.planner.plan import make_plan
from tests.catalogs import new_catalog
from tests.factory import make_base, make_expert
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

# sha256 over the lines "plan_hash planned_bytes block,block,..." of every request below, in
# order, as computed by the planner of commit 89a9eb8 (before issue 31's planning-cost work).
# Change it only together with planner.hashing.HASH_VERSION, on purpose.
# Issue 31 changed default rankings (linear, task_arithmetic: per_tensor; ties: stratified;
# della: stratified by (expert, block)): ORACLE is checked under the previous defaults (every
# plan unchanged: the new ranking code changes no l2 / per_tensor plan), ORACLE_31 under the
# current ones.
ORACLE = "1eb6e7bbea43426f751f8b532049931e95c4ef27e6ddba69408057f8b4c26fc1"
ORACLE_31 = "950015efcc7dcf709cb0a9a9906add257e706954c3565a1896a81be6ba77ed01"
# Then dare_ties planned by (expert, block) units (l2) instead of whole-tensor groups: ORACLE_31
# is checked with dare_ties back on groups (only dare_ties' plans changed), ORACLE_NOW with the
# defaults before utility=auto (ties stratified, dare_ties l2), ORACLE_AUTO as is (auto for ties
# and dare_ties: only their default requests' plans changed).
ORACLE_NOW = "e0f27b2dedcd430ac7282cfda3e501c28258af1fd490967145772173af660c83"
ORACLE_AUTO = "0f9821daab513755e634dadeff6c651c5ae6cfdd6ed71b46a22d607230d9e874"


def _tensors(rng: random.Random, salt: int) -> list[Ten]:
    out = []
    for t in range(6):
        n = rng.randint(1, 5)
        blocks = [Blk(rng.choice((64, 100, 128)), round(rng.uniform(0, 4), 3) if rng.random() > 0.1
                      else 0.0) for _ in range(n)]
        out.append(Ten(f"layer{t}.w", blocks, tau=[round(1 - j / 100, 2) for j in range(100)],
                       above=list(range(100)), tied=[1] * 100))
    return out


def _catalog(tmp: Path) -> Catalog:
    rng = random.Random(31)
    shapes = _tensors(rng, 0)
    cat = Catalog(new_catalog(tmp, "oracle"))
    add_model(cat, base_like("B", shapes))
    for i in range(4):
        ts = [Ten(t.name, [Blk(b.nbytes, round(rng.uniform(0, 4), 3)) for b in t.blocks],
                  tau=t.tau, above=t.above, tied=t.tied) for t in shapes]
        add_model(cat, Model(f"e{i}", ts, base="B", has_stats=i != 3))
    return cat


def _requests() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for op, params in (("linear", {}), ("ties", {"density": 0.5}),
                       ("dare_ties", {"density": 0.2})):
        for experts in ("e0:0.7,e1:0.3", "e2,e0,e1,e3"):
            for budget in (0.1, 0.3, 1.0, "500B"):
                out.append({"operator": op, "experts": experts, "budget": budget,
                            "params": params})
        out.append({"operator": op, "experts": "e0,e1,e2", "budget": 0.3,
                    "params": {**params, "utility": "per_tensor"}})
    return out


def _line(cat: Catalog, r: dict[str, Any]) -> str:
    plan = make_plan(cat, build_request(base="B", **r))
    blocks = ",".join(f"{b.model}/{b.tensor}/{b.block_index}" for b in plan.blocks)
    return f"{plan.plan_hash} {plan.planned_expert_bytes} {blocks}"


def _digest(tmp_path: Path) -> str:
    tmp_path.mkdir()
    with _catalog(tmp_path) as cat:
        lines = [_line(cat, r) for r in _requests()]
    assert len(set(lines)) > 20  # the requests do plan differently
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_plan_hashes_match_the_oracle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _digest(tmp_path / "now") == ORACLE_AUTO
    for name, utility in (("ties", "stratified"), ("dare_ties", "l2")):
        monkeypatch.setitem(REGISTRY, name, replace(REGISTRY[name], default_utility=utility))
    assert _digest(tmp_path / "pre-auto") == ORACLE_NOW
    monkeypatch.setitem(REGISTRY, "dare_ties",
                        replace(REGISTRY["dare_ties"], planning_unit="group"))
    assert _digest(tmp_path / "31") == ORACLE_31
    for name, utility in (("linear", "l2"), ("task_arithmetic", "l2"), ("ties", "per_tensor")):
        monkeypatch.setitem(REGISTRY, name, replace(REGISTRY[name], default_utility=utility))
    monkeypatch.setitem(REGISTRY, "della", replace(REGISTRY["della"], default_utility="l2",
                                                   planning_unit="group"))
    assert _digest(tmp_path / "before") == ORACLE


def test_a_merge_records_the_plan_make_plan_gives(tmp_path: Path) -> None:
    base = make_base(tmp_path / "base", seed=0)
    with Catalog(new_catalog(tmp_path)) as cat:
        ingest_model(cat, base, "base")
        for i in range(3):
            ingest_model(cat, make_expert(base, tmp_path / f"x{i}", seed=i + 1), f"x{i}",
                         base="base")
        for op, params, budget in (("linear", {}, 0.1), ("ties", {"density": 0.5}, 0.3),
                                   ("dare_ties", {"density": 0.5}, 0.5)):
            req = build_request(base="base", experts="x0,x1:0.5,x2", operator=op,
                                params=params, budget=budget)
            want = make_plan(cat, check_inputs(cat, req))
            got = merge(cat, req, tmp_path / f"out-{op}")
            assert got.plan_hash == want.plan_hash
