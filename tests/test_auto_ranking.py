"""utility=auto: the ranking chosen by the spread of the experts' updates over their tensors
(planner.plan.resolve_utility, planner_delta_spread.sql), on hand-computed catalog rows."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.cli.commands.plan import print_plan
from mergepipe.core.operators.registry import REGISTRY
from mergepipe.core.request import build_request
from mergepipe.planner import knapsack
from mergepipe.planner.plan import FLAT_SPREAD, auto_ranking, make_plan
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

# numel = bytes / 2 (planner_rows writes BF16): per-entry RMS of a tensor = l2 / sqrt(numel).
# Flat experts: t0 (two blocks of 100 B, l2 1 each: sqrt(2) / 10) and t1 (one block of 100 B,
# l2 1: 1 / sqrt(50) = sqrt(2) / 10) move every entry alike: coefficient of variation 0.
FLAT = [Ten("t0", [Blk(100, 1.0), Blk(100, 1.0)]), Ten("t1", [Blk(100, 1.0)])]
# Peaked: t1's entries move 3x as much (3 / sqrt(50)): RMS sqrt(2)/10 and 3 sqrt(2)/10, mean
# 2 sqrt(2)/10, population deviation sqrt(2)/10: coefficient of variation 0.5.
PEAKED = [Ten("t0", [Blk(100, 1.0), Blk(100, 1.0)]), Ten("t1", [Blk(100, 3.0)])]


@pytest.fixture
def family(catalog: Catalog) -> Catalog:
    add_model(catalog, base_like("B", FLAT))
    add_model(catalog, Model("f0", FLAT, base="B"))
    add_model(catalog, Model("f1", [Ten("t0", [Blk(100, 2.0), Blk(100, 2.0)]),
                                    Ten("t1", [Blk(100, 2.0)])], base="B"))  # flat, 2x scale
    add_model(catalog, Model("p0", PEAKED, base="B"))
    add_model(catalog, Model("quiet", [Ten("t0", [Blk(100, 0.0), Blk(100, 0.0)]),
                                       Ten("t1", [Blk(100, 0.0)])], base="B"))  # no update
    return catalog


@pytest.mark.parametrize(("experts", "spread"), [
    (["f0"], 0.0), (["p0"], 0.5), (["f0", "f1"], 0.0),
    (["f0", "p0"], 0.25),  # the median of 0 and 0.5, interpolated
    (["f0", "f1", "p0"], 0.0),
    (["quiet"], None),  # no tensor changed
])
def test_the_delta_spread_is_the_median_over_experts_of_their_rms_variation(
        family: Catalog, experts: list[str], spread: float | None) -> None:
    with family.reader() as conn:
        got = knapsack.delta_spread(conn, experts)
    assert got == spread if spread is None else got == pytest.approx(spread, abs=1e-12)


def _plan(cat: Catalog, op: str, experts: str, **params: Any) -> Any:
    density = {"density": 0.5} if REGISTRY[op].density else {}
    return make_plan(cat, build_request(base="B", experts=experts, operator=op,
                                        params={**density, **params}, budget="0.5"))


@pytest.mark.parametrize("op", ["task_arithmetic", "ties", "dare_ties", "della",
                                "breadcrumbs_ties"])
@pytest.mark.parametrize(("experts", "regime"), [("f0,f1", "flat"), ("f0,p0", "peaked"),
                                                 ("p0", "peaked")])
def test_auto_plans_what_the_ranking_it_chose_plans(family: Catalog, op: str, experts: str,
                                                    regime: str) -> None:
    flat, peaked = REGISTRY[op].auto_utility
    assert REGISTRY[op].default_utility == "auto"
    plan = _plan(family, op, experts)
    chosen = flat if regime == "flat" else peaked
    assert plan.ranking is not None
    assert plan.ranking["utility"] == chosen and plan.ranking["regime"] == regime
    assert plan.ranking["flat_below"] == FLAT_SPREAD
    assert (plan.ranking["delta_spread"] < FLAT_SPREAD) == (regime == "flat")
    explicit = _plan(family, op, experts, utility=chosen)
    assert explicit.ranking is None  # an explicit ranking is used as given
    assert [(b.model, b.tensor, b.block_index) for b in plan.blocks] == \
        [(b.model, b.tensor, b.block_index) for b in explicit.blocks]
    assert plan.summary()["ranking"] == plan.ranking
    assert "utility" not in plan.request.params  # the default is not stored in the request
    assert explicit.request.params["utility"] == chosen  # not the default: kept (and hashed)


def test_each_experts_spread_is_read_once_per_model_row(
        family: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[list[str]] = []
    real = knapsack.expert_spreads

    def counted(conn: Any, models: Any) -> dict[str, float]:
        reads.append(sorted(models))
        return real(conn, models)

    monkeypatch.setattr(knapsack, "expert_spreads", counted)
    first = _plan(family, "ties", "f0,p0,quiet")
    assert reads == [["f0", "p0", "quiet"]]
    assert first.ranking is not None and first.ranking["delta_spread"] == 0.25  # quiet: none
    again = _plan(family, "della", "p0,f0,quiet")  # kept, the quiet expert's "none" too
    assert reads == [["f0", "p0", "quiet"]] and again.ranking == first.ranking
    assert _plan(family, "dare_ties", "f1,p0").ranking["delta_spread"] == 0.25
    assert reads[1:] == [["f1"]]
    # the name's rows written again (another created_at): its spread is read anew
    with family.transaction() as conn:
        for table in ("block_stats", "tensor_stats", "blocks", "tensors"):
            conn.execute(SQL(f"DELETE FROM {table} WHERE model = 'p0'"))
        conn.execute(SQL("DELETE FROM models WHERE name = 'p0'"))
    time.sleep(0.01)
    add_model(family, Model("p0", FLAT, base="B"))
    assert _plan(family, "ties", "p0,f0").ranking["regime"] == "flat"
    assert reads[2:] == [["p0"]]


def test_auto_on_an_operator_with_one_ranking_for_both_regimes_reads_no_spread(
        family: Catalog) -> None:
    assert REGISTRY["linear"].auto_utility == ("per_tensor", "per_tensor")
    assert REGISTRY["linear"].default_utility == "per_tensor"
    plan = _plan(family, "linear", "f0,p0", utility="auto")
    assert plan.ranking == {"utility": "per_tensor", "delta_spread": None,
                            "flat_below": FLAT_SPREAD, "regime": None}
    assert _plan(family, "linear", "f0,p0").ranking is None  # its default is not auto


def test_auto_on_an_operator_without_a_measured_pair_is_per_tensor_or_l2(
        family: Catalog) -> None:
    assert REGISTRY["dare_linear"].auto_utility == ("per_tensor", "l2")
    assert REGISTRY["dare_linear"].default_utility == "l2"
    flat = _plan(family, "dare_linear", "f0,f1", utility="auto")
    peaked = _plan(family, "dare_linear", "p0", utility="auto")
    assert (flat.ranking or {}).get("utility") == "per_tensor"
    assert (peaked.ranking or {}).get("utility") == "l2"


def test_the_plan_report_says_which_ranking_auto_chose(family: Catalog,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    print_plan(_plan(family, "della", "f0,p0").summary())
    line = next(s for s in capsys.readouterr().out.splitlines() if "ranking" in s)
    assert line.split() == ["ranking", "region_energy", "(utility=auto:", "peaked", "updates,",
                            "delta", "spread", "0.25,", "flat", "below", f"{FLAT_SPREAD:g})"]


def test_auto_without_a_spread_takes_the_peaked_ranking_and_says_so(
        family: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(family, "della", "quiet")  # no expert changes a tensor: nothing to measure
    assert plan.ranking == {"utility": "region_energy", "delta_spread": None,
                            "flat_below": FLAT_SPREAD, "regime": None}
    assert plan.full_read_bytes == 0 and not plan.blocks
    print_plan(plan.summary())
    assert "ranking         region_energy (utility=auto)" in capsys.readouterr().out


@pytest.mark.parametrize(("spread", "want"), [
    (0.0, ("per_tensor", "flat")), (FLAT_SPREAD - 1e-6, ("per_tensor", "flat")),
    (FLAT_SPREAD, ("l2", "peaked")), (2.0, ("l2", "peaked")), (None, ("l2", None))])
def test_auto_ranking_is_flat_strictly_below_the_threshold(
        spread: float | None, want: tuple[str, str | None]) -> None:
    assert auto_ranking(("per_tensor", "l2"), spread) == want
    assert auto_ranking(("stratified", "stratified"), spread)[0] == "stratified"
