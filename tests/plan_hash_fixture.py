"""The plan-hash fixture of tests/test_plan_hash_fixture.py: requests over every operator, budgets
0.1 / 0.3 / 0.5 / 1.0, several rankings and planning units, on a seeded catalog of rows (four
full experts, one without statistics, one LoRA expert with lora_A bytes), and the line each plan
gives ("plan_hash planned_bytes model/tensor/block,...", or "refused: field" for a request the
planner refuses).

`python -m tests.plan_hash_fixture` (from the repo root, PYTHONPATH=src) writes
tests/data/plan_hashes.json with the planner of the tree on PYTHONPATH. The committed file was
written by main's planner before the planning-cost work of issue 31 (commit bed2417), so the
test checked that the cheaper planner gives every plan unchanged; it was rewritten once since,
when the second ranking study changed three defaults (task_arithmetic, breadcrumbs_ties,
dare_ties): 56 of 340 lines changed, all of those operators (their default ranking or unit; four
task_arithmetic per_tensor lines only in their hash, per_tensor being no longer the default);
and once more when task_arithmetic's default went back to per_tensor (the seven-family
verdict): 16 lines, all task_arithmetic (its 12 default requests plan per_tensor's blocks; its 4
explicit per_tensor ones change only their hash, per_tensor being the default again); and once
more when utility=auto became the default of task_arithmetic, ties, dare_ties and della (the
regime rule): 56 lines. The 12 default requests of each of task_arithmetic, ties and della
plan what auto chooses on this catalog's peaked updates (tensor_energy, region_energy,
region_energy); the 20 explicit requests of those operators and dare_ties whose ranking was
the default (per_tensor, stratified, l2) change only their hash, that ranking being no longer
the default. dare_ties' default requests are unchanged (auto chooses l2 here), and so are
breadcrumbs_ties' when auto became its default too (all 340 lines the same)."""

from __future__ import annotations

import json
import random
import sys
import tempfile
from itertools import product
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators.registry import REGISTRY
from mergepipe.core.request import build_request
from mergepipe.planner.plan import make_plan
from tests.catalogs import new_catalog
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

FIXTURE = Path(__file__).parent / "data" / "plan_hashes.json"
BUDGETS = (0.1, 0.3, 0.5, 1.0)
# (experts, extra params): ranked experts, a reweighted set, one without statistics, a LoRA one
EXPERT_SETS = ("e0,e1,e2", "e2:0.3,e0:0.7,e3,lora")
PAIRS = ("e1:0.6,e0", "lora,e2")  # the two-expert operators' (the others' too)
RANKINGS = ("l2", "per_tensor", "coverage", "stratified")
UNITS = ("group", "group_block")


def build_catalog(folder: Path) -> Catalog:
    """Base B, full experts e0..e2 with statistics, e3 without, and LoRA expert `lora`."""
    rng = random.Random(3131)
    shapes = []
    for t in range(7):
        blocks = [Blk(rng.choice((64, 100, 128)), 0.0) for _ in range(rng.randint(1, 5))]
        shapes.append(Ten(f"layer{t}.w", blocks, tau=[round(1 - j / 100, 2) for j in range(100)],
                          above=list(range(100)), tied=[1] * 100))
    cat = Catalog(new_catalog(folder, "fixture"))
    add_model(cat, base_like("B", shapes))

    def expert(lora: bool) -> list[Ten]:
        return [Ten(t.name, [Blk(b.nbytes, round(rng.uniform(0, 4), 3) if rng.random() > 0.15
                                 else 0.0, round(rng.uniform(0, 1), 3)) for b in t.blocks],
                    lora_a_nbytes=rng.choice((None, 16, 48)) if lora else None,
                    tau=t.tau, above=t.above, tied=t.tied) for t in shapes]
    for i in range(4):
        add_model(cat, Model(f"e{i}", expert(False), base="B", has_stats=i != 3))
    add_model(cat, Model("lora", expert(True), base="B", kind="lora", lora_scale=2.0))
    return cat


def _params(op: str) -> dict[str, Any]:
    spec = REGISTRY[op]
    return {"density": 0.5} if spec.density else {}


def requests() -> list[dict[str, Any]]:
    """Every operator at every budget on both expert sets with its defaults (and two pairs);
    the additive and sparse ones under every ranking; linear and ties under both group units."""
    def req(op: str, experts: str, budget: float, **params: Any) -> dict[str, Any]:
        return {"operator": op, "experts": experts, "budget": budget,
                "params": {**_params(op), **params}}

    out: list[dict[str, Any]] = []
    for op in sorted(REGISTRY):
        out += [req(op, e, b) for e, b in product(EXPERT_SETS, BUDGETS)]
        out += [req(op, e, b) for e, b in product(PAIRS, (0.3, 1.0))]
    out += [req(op, EXPERT_SETS[1], b, utility=u) for op, u, b in product(
        ("linear", "task_arithmetic", "ties", "dare_ties", "della", "breadcrumbs"), RANKINGS,
        BUDGETS)]
    out += [req(op, EXPERT_SETS[1], b, unit=unit, utility=u) for op, unit, u, b in product(
        ("linear", "ties"), UNITS, ("l2", "stratified"), BUDGETS[:2])]
    return out


def line(cat: Catalog, r: dict[str, Any]) -> str:
    """What the test compares of one plan (or the field of its refusal)."""
    try:
        plan = make_plan(cat, build_request(base="B", **r))
    except InvalidRequest as e:
        return f"refused: {e.field}"
    blocks = ",".join(f"{b.model}/{b.tensor}/{b.block_index}" for b in plan.blocks)
    return f"{plan.plan_hash} {plan.planned_expert_bytes} {blocks}"


def main() -> None:
    with tempfile.TemporaryDirectory() as d, build_catalog(Path(d)) as cat:
        lines = [(r, line(cat, r)) for r in requests()]
    rows = [{"request": r, "line": text} for r, text in lines]
    FIXTURE.write_text(json.dumps(rows, indent=1) + "\n")
    planned = sum(not text.startswith("refused") for _, text in lines)
    print(f"{len(rows)} requests ({planned} planned) -> {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
