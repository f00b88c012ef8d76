"""The fidelity benchmark end to end in --quick mode: every figure, and size-free invariants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

# the study merges and evaluates a model at every budget (~45 s): make test-all runs it
pytestmark = pytest.mark.slow

from mergepipe_bench.fidelity.report import write_report  # noqa: E402
from mergepipe_bench.fidelity.run import quick_config, run_fidelity  # noqa: E402

REL_TOL = 1e-6  # float32 summation noise, relative to ||M_full||


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("fidelity")
    res = run_fidelity(quick_config(), root)
    write_report(res, root / "FIDELITY.md", root / "fidelity-kl.png", "mergepipe fidelity --quick")
    return res, root


def test_every_figure_is_produced(quick: tuple[dict, Path]) -> None:
    res, root = quick
    stored = json.loads((root / "results.json").read_text())
    assert stored["config"] == json.loads(json.dumps(res["config"]))
    assert (root / "fidelity-kl.png").stat().st_size > 1000
    md = (root / "FIDELITY.md").read_text()
    cfg = quick_config()
    for op in cfg.operators:
        assert f"## {op.name}" in md
    assert len(res["operators"]) == len(cfg.operators)
    for op in res["operators"]:
        assert [b["fraction"] for b in op["budgets"]] == list(cfg.budgets)
        assert op["base"]["kl"]["answer"] > 0
        assert set(op["base"]["kl"]["answer_by_task"]) == set(cfg.family.tasks)
        for row in op["budgets"]:
            assert len(row["random"]) == cfg.random_plans
            for m in [row["utility"], *row["random"]]:
                assert set(m["kl"]) >= {"all", "answer", "all_by_task", "answer_by_task"}
                assert 0 <= m["accuracy"]["mean"] <= 1


def test_full_budget_reproduces_the_full_merge(quick: tuple[dict, Path]) -> None:
    for op in quick[0]["operators"]:
        full = next(b for b in op["budgets"] if b["fraction"] == 1.0)["utility"]
        assert full["kl"]["all"] < 1e-9
        assert full["l2"]["rel"] < 1e-6
        assert full["expert_bytes_read"] == op["full"]["full_read_bytes"]
        if op["operator"] in ("linear", "task_arithmetic"):  # engine vs a plain torch merge
            assert op["reference"]["l2"]["rel"] < 1e-6


def test_bytes_and_bounds(quick: tuple[dict, Path]) -> None:
    for op in quick[0]["operators"]:
        full_norm = op["base"]["l2"]["abs"] / op["base"]["l2"]["rel"]
        for row in op["budgets"]:
            u = row["utility"]
            assert u["expert_bytes_read"] <= row["budget_bytes"]
            for r in row["random"]:
                assert r["expert_bytes_read"] <= u["planned_expert_bytes"]  # equal bytes
            for m in [u, *row["random"]]:
                assert m["expert_bytes_read"] == m["planned_expert_bytes"]
                if op["operator"] in ("linear", "task_arithmetic"):
                    assert m["omission_bound"] is not None
                    assert m["omission_bound"] + REL_TOL * full_norm >= m["l2"]["abs"]
                    # the tighter bound (blocks in quadrature), also for the random plans
                    assert m["omission_bound_l2"] <= m["omission_bound"]
                    assert m["omission_bound_l2"] + REL_TOL * full_norm >= m["l2"]["abs"]
