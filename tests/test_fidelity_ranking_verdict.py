"""The ranking study's done-when (benchmarks.fidelity.ranking_verdict) on hand-made results:
a cell passes strictly below the random median, the mid-budget average is a geometric mean
over every family at 0.3 and 0.5, and runs with other random seeds pool their plans."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from mergepipe_bench.fidelity.ranking_verdict import (
    add_auto,
    load,
    spearman,
    verdict,
    weight_agreement,
    weights_summary,
)

from mergepipe.planner.plan import FLAT_SPREAD, auto_ranking


def _row(rankings: dict[str, float], random: list[float], default: float) -> dict[str, Any]:
    return {"rankings": {k: {"kl": v} for k, v in rankings.items()},
            "default": {"kl": default}, "random": [{"kl": v} for v in random]}


def _res(base_kl: float, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"operators": {"dare_ties": {"base_kl": base_kl, "budgets": rows}}}


def _results() -> dict[str, dict[str, Any]]:
    return {
        # base KL 2: ratios are half the KLs
        "toy": _res(2.0, {
            "0.1": _row({"l2": 1.0, "per_tensor": 1.2}, [1.4, 0.8, 1.0, 2.0], default=1.6),
            "0.3": _row({"l2": 0.4, "per_tensor": 0.2}, [0.6, 0.9, 0.7], default=0.4),
            "0.5": _row({"l2": 0.1, "per_tensor": 0.4}, [0.3, 0.5, 0.4], default=0.1)}),
        "realistic": _res(1.0, {
            "0.3": _row({"l2": 0.05, "per_tensor": 0.1}, [0.2, 0.3, 0.25], default=0.3),
            "0.5": _row({"l2": 0.02, "per_tensor": 0.001}, [0.1, 0.1, 0.2], default=0.02)}),
    }


def test_a_cell_passes_strictly_below_the_random_median() -> None:
    v = verdict(_results(), "dare_ties", "l2")
    toy01 = next(c for c in v.cells if (c.family, c.budget) == ("toy", "0.1"))
    # random ratios 0.7, 0.4, 0.5, 1.0: median 0.6 (even count: mean of the middle two)
    assert toy01.median == pytest.approx(0.6)
    assert toy01.default == pytest.approx(0.5) and toy01.passed
    v_pt = verdict(_results(), "dare_ties", "per_tensor")
    # equal to the median at toy 0.1 (0.6) and toy 0.5 (0.2): not below, so failed
    assert [(c.family, c.budget) for c in v_pt.failed] == [("toy", "0.1"), ("toy", "0.5")]
    v_def = verdict(_results(), "dare_ties", "default")
    assert [(c.family, c.budget) for c in v_def.failed] == [("toy", "0.1"), ("realistic", "0.3")]
    assert not v_def.passed


def test_the_mid_budget_average_is_a_geometric_mean_over_families() -> None:
    v = verdict(_results(), "dare_ties", "l2")
    assert v.mid_mean["l2"] == pytest.approx((0.2 * 0.05 * 0.05 * 0.02) ** 0.25)
    assert v.mid_mean["per_tensor"] == pytest.approx((0.1 * 0.2 * 0.1 * 0.001) ** 0.25)
    assert set(v.mid_mean) == {"l2", "per_tensor"}  # the run's default is another plan
    # per_tensor's mean (0.0376) is below l2's (0.0562): l2 fails the average, not the cells
    assert v.best_other == ("per_tensor", pytest.approx(v.mid_mean["per_tensor"]))
    assert not v.failed and not v.mid_ok and not v.passed
    assert verdict(_results(), "dare_ties", "per_tensor").mid_ok


def test_a_ranking_missing_from_a_mid_cell_does_not_enter_the_average() -> None:
    res = _results()
    res["realistic"]["operators"]["dare_ties"]["budgets"]["0.5"]["rankings"]["stratified"] = {
        "kl": 1e-9}
    assert "stratified" not in verdict(res, "dare_ties", "l2").mid_mean
    with pytest.raises(KeyError, match="stratified"):
        verdict(res, "dare_ties", "stratified")


def test_runs_with_other_seeds_pool_their_random_plans(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "ranking-toy.json").write_text(json.dumps(_res(1.0, {
        "0.3": _row({"l2": 0.5}, [0.4, 0.6, 0.7], default=0.5)})))
    later = _row({"l2": 0.9, "per_tensor": 0.3}, [0.1, 0.2, 0.3], default=0.9)
    later["random_seeds"] = [1003, 1005]  # the first run's were 1000..1002 (no record kept)
    (b / "ranking-toy.json").write_text(json.dumps(_res(1.0, {"0.3": later})))
    v = verdict(load([a, b], ["toy", "small"]), "dare_ties", "l2")
    (cell,) = v.cells
    # the first run's plan, the six random plans together: median (0.3 + 0.4) / 2
    assert cell.default == 0.5 and len(cell.random) == 6
    assert cell.median == pytest.approx(0.35) and not cell.passed
    assert math.isclose(v.mid_mean["per_tensor"], 0.3)  # a ranking only the later run has
    # a third run with seeds 1002..1004 adds nothing: those seeds are in already
    c = tmp_path / "c"
    c.mkdir()
    again = _row({"l2": 0.9}, [0.01, 0.01, 0.01], default=0.9)
    again["random_seeds"] = [1002, 1004]
    (c / "ranking-toy.json").write_text(json.dumps(_res(1.0, {"0.3": again})))
    (cell,) = verdict(load([a, b, c], ["toy"]), "dare_ties", "l2").cells
    assert len(cell.random) == 6 and cell.median == pytest.approx(0.35)


def test_auto_takes_each_familys_flat_or_peaked_ranking() -> None:
    res = _results()
    # toy peaked (spread 0.3): l2's plans; realistic flat (0.1): per_tensor's (the planner's
    # own choice under its threshold, 0.22)
    assert FLAT_SPREAD == 0.22
    choose = lambda s: auto_ranking(("per_tensor", "l2"), s)[0]  # noqa: E731
    add_auto(res, "dare_ties", choose, {"toy": 0.3, "realistic": 0.1})
    v = verdict(res, "dare_ties", "auto")
    got = {(c.family, c.budget): c.default for c in v.cells}
    assert got == {("toy", "0.1"): 0.5, ("toy", "0.3"): 0.2, ("toy", "0.5"): 0.05,
                   ("realistic", "0.3"): 0.1, ("realistic", "0.5"): 0.001}
    assert not v.failed  # l2 wins toy, per_tensor realistic: each regime its winner
    # geometric mean at 0.3 / 0.5 of 0.2, 0.05, 0.1, 0.001
    assert v.mid_mean["auto"] == pytest.approx((0.2 * 0.05 * 0.1 * 0.001) ** 0.25)
    # a family without a spread gets no auto plan: the verdict refuses it as not measured
    res = _results()
    add_auto(res, "dare_ties", choose, {"toy": 0.3})
    with pytest.raises(KeyError, match="auto"):
        verdict(res, "dare_ties", "auto")


def test_spearman_of_equal_and_reversed_orders() -> None:
    a = {"x": 1.0, "y": 2.0, "z": 3.0, "w": 4.0}
    assert spearman(a, {k: 10 * v for k, v in a.items()}) == pytest.approx(1.0)
    assert spearman(a, {k: -v for k, v in a.items()}) == pytest.approx(-1.0)
    # one swap of neighbours among 4: 1 - 6 * 2 / (4 * 15)
    assert spearman(a, {"x": 1.0, "y": 3.0, "z": 2.0, "w": 4.0}) == pytest.approx(0.8)
    assert spearman(a, {"x": 1.0}) == 0.0  # fewer than two common keys


def _wplan(kl: float, rel: float, tensor: float) -> dict[str, float]:
    return {"kl": kl, "rel_l2": rel, "tensor_rel": tensor}


def test_weight_agreement_per_family_over_the_cells_with_weights() -> None:
    random = [_wplan(0.5, 0.5, 0.5), _wplan(0.6, 0.6, 0.6), _wplan(0.7, 0.7, 0.7)]
    res = {"copies": {"operators": {"ties": {"base_kl": 1.0, "budgets": {
        # rel_l2 orders the plans as KL does; tensor_rel the other way round; l2 is closer
        # than the random median (0.6) in tensor_rel and farther in KL (0.9 > 0.6)
        "0.3": {"rankings": {"l2": _wplan(0.9, 0.9, 0.1), "per_tensor": _wplan(0.4, 0.4, 0.9)},
                "random": random},
        # no weights recorded (a run without --weights): left out
        "0.5": {"rankings": {"l2": {"kl": 0.1}}, "random": [{"kl": 0.2}, {"kl": 0.3}]}}}}}}
    (w,) = weight_agreement(res, "ties")
    assert (w.family, w.operator) == ("copies", "ties")
    assert w.spearman["rel_l2"] == (pytest.approx(1.0),)
    # KL ranks: per_tensor 0, randoms 1-3, l2 4; tensor_rel ranks: l2 0, randoms 1-3,
    # per_tensor 4: squared rank differences 16 + 16, 1 - 6 * 32 / (5 * 24) = -0.6
    assert w.spearman["tensor_rel"] == (pytest.approx(-0.6),)
    assert (w.closer_farther, w.rankings) == (1, 2)
    assert weight_agreement(res, "dare_ties") == []
    assert "| copies | ties | 1 | +1.00 [+1.00, +1.00] | -0.60 [-0.60, -0.60] | 1/2 |" in (
        weights_summary(res, ["ties"]))

