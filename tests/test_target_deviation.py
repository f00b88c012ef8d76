"""The predicted deviation of a plan and --target-deviation (CLI, API, Python API), on a tiny
catalog with hand-picked statistics (tests/planner_rows.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from mergepipe.cli.main import main
from tests.catalogs import new_catalog
from tests.planner_rows import two_expert_catalog

# alpha = (2, 1) (task_arithmetic, lambda 2, e1 weight 0.5): per (tensor, block) the summed
# utility is t0.0 2x4+6, t0.1 0+2, t0.2 2x1+2, t1.0 2x2+0, t1.1 2x1+3
UPDATE_L2 = math.sqrt(14**2 + 2**2 + 4**2 + 4**2 + 5**2)
REQUEST = ("--experts", "e0,e1:0.5", "--op", "task_arithmetic", "--param", "lambda=2")


@pytest.fixture
def db(tmp_path: Path) -> str:
    return two_expert_catalog(tmp_path)


def plan(db: str, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["--catalog", db, "plan", "--base", "B", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_predicted_deviation_is_hand_computed(db: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(db, capsys, *REQUEST, "--budget", "200B")
    # omitted per block (test_planner_cli): sqrt(72); the full update bound: sqrt(257)
    assert out["update_bound_l2"] == pytest.approx(UPDATE_L2)
    assert out["predicted_deviation"] == pytest.approx(math.sqrt(72) / UPDATE_L2)
    assert plan(db, capsys, *REQUEST)["predicted_deviation"] == 0.0  # the full read
    assert main(["--catalog", db, "plan", "--base", "B", *REQUEST, "--budget", "200B"]) == 0
    shown = capsys.readouterr().out
    assert f"predicted dev.  {math.sqrt(72) / UPDATE_L2:.4g} " in shown
    # no bound, no prediction: ties, and an expert without statistics
    assert plan(db, capsys, "--experts", "e0", "--op", "ties", "--param", "density=0.5",
                "--budget", "0.5")["predicted_deviation"] is None
    assert plan(db, capsys, "--experts", "e0,nostats", "--op", "linear",
                "--budget", "0.5")["predicted_deviation"] is None


@pytest.mark.parametrize("target", [0.99, 0.9, 0.6, 0.35, 0.1])
def test_target_picks_the_smallest_grid_budget(db: str, capsys: pytest.CaptureFixture[str],
                                               target: float) -> None:
    out = plan(db, capsys, *REQUEST, "--target-deviation", str(target))
    search = out["budget_search"]
    f = search["fraction"]
    assert out["budget"] == {"fraction": f} and out["predicted_deviation"] <= target
    assert search["predicted_deviation"] == out["predicted_deviation"]
    assert search["resolution"] == 0.01 and search["plans"] <= 8
    # the plan of that budget, asked for directly, is the same plan
    assert plan(db, capsys, *REQUEST, "--budget", str(f))["plan_hash"] == out["plan_hash"]
    # the grid point under it misses the target (or reads no expert byte at all)
    below = round(f - 0.01, 2)
    assert search["below"] == below
    code = main(["--catalog", db, "plan", "--base", "B", *REQUEST, "--budget", str(below),
                 "--json"])
    captured = capsys.readouterr()
    if code == 0:
        assert json.loads(captured.out)["predicted_deviation"] > target
    else:
        assert "reads no expert byte" in captured.err and search["below_deviation"] is None


def test_target_zero_needs_the_full_read(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(db, capsys, *REQUEST, "--target-deviation", "0")
    assert out["budget_search"]["fraction"] == 1.0 and out["predicted_deviation"] == 0.0
    assert out["budget_search"]["below_deviation"] > 0


def test_readable_output_says_how_the_budget_was_chosen(
        db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--catalog", db, "plan", "--base", "B", *REQUEST,
                 "--target-deviation", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "target          deviation <= 0.5: budget " in out and "grid 0.01" in out


@pytest.mark.parametrize(("args", "message"), [
    (("--target-deviation", "0.5", "--budget", "0.3"), "give either a budget or a target"),
    (("--target-deviation", "1.5"), "target_deviation: Input should be less than or equal to 1"),
    (("--target-deviation", "-0.1"), "greater than or equal to 0"),
    (("--target-deviation", "nan"), "target_deviation: Input should be a finite number"),
    (("--target-deviation", "half"), "target deviation 'half' is not a number"),
])
def test_bad_targets_are_one_line(db: str, capsys: pytest.CaptureFixture[str],
                                  args: tuple[str, ...], message: str) -> None:
    assert main(["--catalog", db, "plan", "--base", "B", *REQUEST, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("request_args", "why"), [
    (("--experts", "e0", "--op", "ties", "--param", "density=0.5"), "ties"),
    (("--experts", "e0,nostats", "--op", "linear"), "no statistics for nostats"),
])
def test_no_prediction_no_target(db: str, capsys: pytest.CaptureFixture[str],
                                 request_args: tuple[str, ...], why: str) -> None:
    assert main(["--catalog", db, "plan", "--base", "B", *request_args,
                 "--target-deviation", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "no predicted deviation" in err and why in err and "give a budget" in err


def test_api_plans_with_a_target(db: str, tmp_path: Path) -> None:
    from tests import api_helpers

    body: dict[str, Any] = {"base": "B", "operator": "task_arithmetic", "params": {"lambda": 2},
                            "experts": [{"model": "e0"}, {"model": "e1", "weight": 0.5}]}
    settings = api_helpers.settings_for(tmp_path, catalog=db)
    with api_helpers.client_for(settings) as c:
        r = c.post("/v1/plans", json={**body, "target_deviation": 0.35})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["budget_search"]["fraction"] == 0.56  # as the CLI's search (hand-checked)
        assert out["predicted_deviation"] <= 0.35 < out["budget_search"]["below_deviation"]
        same = c.post("/v1/plans", json={**body, "budget": {"fraction": 0.56}}).json()
        assert same["plan_hash"] == out["plan_hash"]
        assert same["predicted_deviation"] == out["predicted_deviation"]
        cases: list[tuple[dict[str, Any], str]] = [
            ({"target_deviation": 2}, "target_deviation"),
            ({"target_deviation": "0.5"}, "target_deviation"),
            ({"target_deviation": 0.5, "budget": {"fraction": 0.5}}, "target_deviation")]
        for extra, field in cases:
            for path in ("/v1/plans", "/v1/merges"):
                payload = {**body, **extra, **({"output": {"name": "o"}} if "merges" in path
                                                else {})}
                bad = c.post(path, json=payload)
                assert bad.status_code == 422, (path, extra, bad.text)
                assert bad.json()["error"]["field"] == field
        ties = c.post("/v1/plans", json={**body, "operator": "ties", "params": {},
                                         "target_deviation": 0.5})
        assert ties.status_code == 422 and "no predicted deviation" in ties.text


def test_merge_with_a_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests import factory

    base = factory.make_base(tmp_path / "base", seed=0)
    for i in range(2):
        factory.make_expert(base, tmp_path / f"e{i}", seed=10 + i)
    db = str(new_catalog(tmp_path))
    assert main(["--catalog", db, "ingest", str(base), "--name", "base"]) == 0
    for i in range(2):
        assert main(["--catalog", db, "ingest", str(tmp_path / f"e{i}"), "--name", f"e{i}",
                     "--base", "base"]) == 0
    capsys.readouterr()
    assert main(["--catalog", db, "merge", "--base", "base", "--experts", "e0,e1",
                 "--op", "linear", "--target-deviation", "0.4", "--out",
                 str(tmp_path / "out"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    search = out["budget_search"]
    assert out["predicted_deviation"] == search["predicted_deviation"] <= 0.4
    assert search["below_deviation"] > 0.4 and 0 < search["fraction"] < 1
    assert out["budget_bytes"] == math.floor(search["fraction"] * out["full_read_bytes"])
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["predicted_deviation"] == out["predicted_deviation"]
    assert manifest["plan"]["budget"] == {"fraction": search["fraction"]}
