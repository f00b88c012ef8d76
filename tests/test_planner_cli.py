"""`mergepipe plan`: readable and JSON output, errors as one line and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mergepipe.cli.main import main
from tests.planner_rows import two_expert_catalog


@pytest.fixture
def db(tmp_path: Path) -> str:
    return two_expert_catalog(tmp_path)


def run(db: str, *args: str) -> int:
    return main(["--catalog", db, "plan", "--base", "B", *args])


def test_json_output(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the hand-computed plan below ranks by l2 (task_arithmetic's default is per_tensor)
    assert run(db, "--experts", "e0,e1:0.5", "--op", "task_arithmetic", "--budget", "200B",
               "--param", "lambda=2", "--param", "utility=l2", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["operator"] == "task_arithmetic" and out["params"]["lambda"] == 2.0
    assert (out["budget_bytes"], out["full_read_bytes"], out["planned_expert_bytes"]) == (
        200, 680, 180)
    # alpha = (2, 1): total utility 2 x 8 + 13 = 29, selected e0.t0.0 + e1.t1.1 + e0.t1.1 = 13.
    assert out["omission_bound"] == pytest.approx(16.0)
    # per (tensor, block), omitted: t0.0 6, t0.1 2, t0.2 2 x 1 + 2, t1.0 2 x 2 -> sqrt(72)
    assert out["omission_bound_l2"] == pytest.approx(72 ** 0.5)
    assert [e["planned_bytes"] for e in out["experts"]] == [140, 40]
    assert len(out["plan_hash"]) == 64 and "blocks" not in out


def _ties_plan(db: str, capsys: pytest.CaptureFixture[str], *params: str) -> dict:
    assert run(db, "--experts", "e0", "--op", "ties", "--param", "density=0.5", *params,
               "--budget", "0.5", "--blocks", "-1", "--json") == 0
    return json.loads(capsys.readouterr().out)


def test_ties_ranks_auto_by_default(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    default = _ties_plan(db, capsys)
    chosen = default["ranking"]["utility"]  # what auto chose, reported by the plan
    assert chosen in ("per_tensor", "region_energy")
    explicit = _ties_plan(db, capsys, "--param", f"utility={chosen}")
    l2 = _ties_plan(db, capsys, "--param", "utility=l2")
    assert default["blocks"] == explicit["blocks"] != l2["blocks"]
    assert len({default["plan_hash"], explicit["plan_hash"], l2["plan_hash"]}) == 3
    assert "utility" not in default["params"] and l2["params"]["utility"] == "l2"


def test_json_blocks(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the hand-computed ranking below is l2's (ties ranks auto by default)
    assert run(db, "--experts", "e0", "--op", "ties", "--param", "density=0.5",
               "--param", "utility=l2", "--budget", "0.5", "--blocks", "-1", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["omission_bound"] is None and out["experts"][0]["density"] == 0.5
    assert (out["unit"], out["unit_region"]) == ("expert_block", None)
    assert out["blocks"][0] == {"model": "e0", "tensor": "t0", "block_index": 0, "nbytes": 100,
                                "utility": 4.0, "rank": 0}
    assert sum(b["nbytes"] for b in out["blocks"]) == out["planned_expert_bytes"] <= 170
    # whole-tensor groups: t0 (5 / 200 bytes) does not fit in 170, t1 (3 / 140) does
    assert run(db, "--experts", "e0", "--op", "ties", "--param", "density=0.5",
               "--param", "unit=group", "--budget", "0.5", "--blocks", "-1", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["unit"], out["unit_region"]) == ("group", "tensor")
    assert out["blocks"][0] == {"model": "e0", "tensor": "t1", "block_index": 0, "nbytes": 100,
                                "utility": 2.0, "rank": 0}
    assert sum(b["nbytes"] for b in out["blocks"]) == out["planned_expert_bytes"] == 140


def test_readable_output(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(db, "--experts", "e0,nostats:0.5", "--op", "linear", "--budget", "0.5",
               "--blocks", "2") == 0
    out = capsys.readouterr().out
    assert "fraction 0.5 of the full read" in out
    assert "omission bound  none (no statistics for nostats)" in out
    assert "fallback        nostats: no statistics, planned as whole tensors" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("expert "))
    assert lines[header + 2].split()[:2] == ["e0", "full"]
    assert lines[header + 3].split()[-1] == "yes"
    assert "rank  model  tensor  block  bytes  utility" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--experts", "e0,ghost", "--op", "linear"], "model 'ghost' not found"),
    (["--experts", "e0", "--op", "nope"], "unknown operator 'nope'"),
    (["--experts", "e0", "--op", "linear", "--budget", "0"], "budget.fraction: 0 is outside (0, 1]"),
    (["--experts", "e0", "--op", "ties", "--param", "density"], "use KEY=VALUE"),
])
def test_errors_are_one_line(db: str, capsys: pytest.CaptureFixture[str], args: list[str],
                             message: str) -> None:
    assert run(db, *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("mergepipe plan: error:")
    assert len(err.strip().splitlines()) == 1


def test_mergekit_config(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "merge.yml"
    config.write_text("merge_method: ties\nbase_model: B\nparameters:\n  density: 0.5\n"
                      "models:\n  - model: e0\n    parameters: {weight: 1.0}\n"
                      "  - model: e1\n    parameters: {weight: 0.5}\n")
    assert main(["--catalog", db, "plan", str(config), "--budget", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["operator"] == "ties" and [e["model"] for e in out["experts"]] == ["e0", "e1"]
    assert out["planned_expert_bytes"] <= out["budget_bytes"] == out["full_read_bytes"] // 2


def test_readable_output_shows_both_bounds(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(db, "--experts", "e0,e1:0.5", "--op", "task_arithmetic", "--budget", "200B",
               "--param", "lambda=2") == 0
    out = capsys.readouterr().out
    assert "omission bound  16 " in out and f"omission L2     {72 ** 0.5:.6g} " in out


def test_utility_param(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(db, "--experts", "e0,e1", "--op", "linear", "--budget", "200B",
               "--param", "utility=per_tensor", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert "utility" not in out["params"]  # linear's default: not stored
    # e1.t1.1 (3/3/40) then e0.t1.1 (1/sqrt(5)/40) then e0.t0.0 (4/sqrt(17)/100): 180 bytes
    assert out["planned_expert_bytes"] == 180
    assert run(db, "--experts", "e0,e1", "--op", "task_arithmetic", "--budget", "200B",
               "--param", "utility=l2", "--json") == 0
    assert json.loads(capsys.readouterr().out)["params"]["utility"] == "l2"
    assert run(db, "--experts", "e0,e1", "--op", "task_arithmetic", "--budget", "200B",
               "--param", "utility=auto", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert "utility" not in out["params"]  # its default
    assert out["ranking"]["utility"] in ("per_tensor", "tensor_energy")  # what auto chose
    assert run(db, "--experts", "e0", "--param", "utility=bogus") != 0
