"""The planning-unit study end to end in --quick mode: budgets, full-budget equality, tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

# the study runs merges and a model per unit (~20 s); make test keeps test_fidelity_quick.py
pytestmark = pytest.mark.slow

from mergepipe_bench.fidelity.units import quick_units_config, run_units  # noqa: E402
from mergepipe_bench.fidelity.units_report import render  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("units")
    return run_units(quick_units_config(), root, name="units-quick"), root


def test_every_unit_and_baseline_is_measured(quick: tuple[dict, Path]) -> None:
    res, root = quick
    cfg = quick_units_config()
    assert json.loads((root / "units-quick.json").read_text())["config"] == json.loads(
        json.dumps(res["config"]))
    assert len(res["family"]["experts"]) == 4
    (op,) = res["operators"]
    assert op["operator"] == "dare_ties" and op["default_unit"] == "expert_block"
    assert op["base"]["kl"]["answer"] > 0
    for row in op["budgets"]:
        assert set(row["units"]) == set(cfg.units)
        assert len(row["random_block"]) == len(row["random_group"]) == 1
        budget = row["fraction"] * op["full_read_bytes"]
        for m in row["units"].values():  # budget-sound, as executed
            assert m["expert_bytes_read"] == m["planned_expert_bytes"] <= budget
            assert m["kl_ratio"] >= 0 and 0 <= m["exact_match"] <= 1
        for m in row["random_block"] + row["random_group"]:  # equal bytes, never more
            assert m["expert_bytes_read"] <= row["random_bytes"]
    md = render([("quick", res)], "mergepipe fidelity --units --quick")
    assert "| quick | dare_ties | 0.5 |" in md and "random whole-tensor groups" in md


def test_full_budget_equals_the_full_merge_for_every_unit(quick: tuple[dict, Path]) -> None:
    (op,) = quick[0]["operators"]
    full = next(r for r in op["budgets"] if r["fraction"] == 1.0)
    for m in full["units"].values():
        assert m["expert_bytes_read"] == op["full_read_bytes"]
        assert m["kl"]["all"] < 1e-9 and m["l2"]["rel"] < 1e-6
