"""`mergepipe merge` on the command line: JSON fields, readable summary, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.cli.commands.merge import parse_params
from mergepipe.cli.main import main
from mergepipe.core.errors import InvalidRequest
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

DESIGN_FIELDS = {"merge_id", "plan_hash", "operator", "budget_bytes", "full_read_bytes",
                 "planned_expert_bytes", "expert_bytes_read", "omission_bound", "output",
                 "wall_seconds", "base_bytes_read"}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("cli")
    db = new_catalog(root)
    with Catalog(db) as cat:
        ingest_family(cat, root / "fam")
    return str(db)


def test_merge_json_prints_the_design_fields(db: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    rc = main(["--catalog", db, "merge", "--base", "base", "--experts", "e0,e1:0.5",
               "--op", "task_arithmetic", "--param", "lambda=0.5", "--budget", "2KiB",
               "--out", str(tmp_path / "o1"), "--seed", "5", "--dtype", "fp32", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r.keys() >= DESIGN_FIELDS
    assert r["budget_bytes"] == 2048 and r["expert_bytes_read"] <= 2048
    assert r["operator"] == "task_arithmetic" and r["output"] == str(tmp_path / "o1")
    assert r["output_name"] == "o1" and r["omission_bound"] > 0


def test_merge_prints_a_readable_summary(db: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    rc = main(["--catalog", db, "merge", "--base", "base", "--experts", "e0,e1,e2",
               "--op", "ties", "--param", "density=0.5", "--budget", "0.3",
               "--out", str(tmp_path / "o2"), "--name", "ties30"])
    assert rc == 0
    out = capsys.readouterr()
    assert "succeeded: ties of 3 expert(s)" in out.out and "model 'ties30'" in out.out
    assert "= 30% of the full read" in out.out
    assert out.err == ""  # no progress bar off a terminal


def test_merge_errors_are_one_line(db: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["--catalog", db, "merge", "--base", "base", "--experts", "nope",
                 "--op", "linear", "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err
    assert main(["--catalog", db, "merge", "--base", "base", "--experts", "e0",
                 "--op", "linear"]) == 2
    assert "--out is required" in capsys.readouterr().err
    assert not (tmp_path / "o3").exists()


def test_param_values_are_typed() -> None:
    assert parse_params(["density=0.5", "normalize=false", "rescale=l1"]) == {
        "density": 0.5, "normalize": False, "rescale": "l1"}
    with pytest.raises(InvalidRequest, match="KEY=VALUE"):
        parse_params(["density"])
