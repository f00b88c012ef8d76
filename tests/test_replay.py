"""Replay re-executes the stored access set and verifies every output tensor hash."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.cli.main import main
from mergepipe.core.errors import Conflict, NotFound
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge
from mergepipe.jobs.replay import replay, stored_plan
from tests.catalogs import copy_catalog, new_catalog
from tests.executor_family import ingest_family


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path | str:
    root = tmp_path_factory.mktemp("replay")
    db = new_catalog(root)
    with Catalog(db) as cat:
        ingest_family(cat, root / "fam")
    return db


@pytest.fixture
def catalog(family: Path | str, tmp_path: Path) -> Iterator[Catalog]:
    """A copy of the module's catalog (each test may change its records)."""
    cat = Catalog(copy_catalog(family, tmp_path))
    yield cat
    cat.close()


@pytest.fixture
def done(catalog: Catalog, tmp_path: Path) -> dict:
    req = build_request(base="base", experts="e0,e1,e2:0.5", operator="ties", budget=0.5,
                        params={"density": 0.3}, seed=11)
    return merge(catalog, req, tmp_path / "out").to_dict()


def test_replay_matches_and_reads_the_same_bytes(catalog: Catalog, done: dict,
                                                 tmp_path: Path) -> None:
    r = replay(catalog, done["merge_id"]).to_dict()
    assert r["match"] and not r["mismatched_tensors"] and r["n_tensors"] == 19
    assert r["output_hash"] == done["output_hash"]
    assert r["expert_bytes_read"] == done["expert_bytes_read"]
    assert r["output"] is None
    kept = replay(catalog, done["merge_id"], tmp_path / "again").to_dict()
    assert kept["match"] and (tmp_path / "again" / "model.safetensors").exists()


def test_replay_of_a_non_default_ranking_keeps_its_bounds(catalog: Catalog,
                                                           tmp_path: Path) -> None:
    # coverage: a ranking other than task_arithmetic's default (per_tensor since issue 31), so
    # the request stores it
    req = build_request(base="base", experts="e0,e1", operator="task_arithmetic", budget=0.4,
                        params={"utility": "coverage"})
    done = merge(catalog, req, tmp_path / "pt").to_dict()
    assert done["omission_bound_l2"] is not None
    assert 0 < done["omission_bound_l2"] <= done["omission_bound"]
    sp = stored_plan(catalog, done["merge_id"])
    assert sp.request.params["utility"] == "coverage"
    assert sp.omission_bound_l2 == pytest.approx(done["omission_bound_l2"])
    r = replay(catalog, done["merge_id"]).to_dict()
    assert r["match"] and r["expert_bytes_read"] == done["expert_bytes_read"]


def test_replay_uses_the_stored_access_set_not_a_new_plan(catalog: Catalog, done: dict) -> None:
    # Drop half the access set from the record: replay must follow the record (and differ).
    with catalog.transaction() as conn:
        conn.execute(SQL("DELETE FROM touched_blocks WHERE merge_id = :m AND rank % 2 = 1"),
                     {"m": done["merge_id"]})
    r = replay(catalog, done["merge_id"]).to_dict()
    assert not r["match"] and r["mismatched_tensors"]
    assert r["expert_bytes_read"] < done["expert_bytes_read"]


def test_cli_replay_exit_status(catalog: Catalog, done: dict, capsys: pytest.CaptureFixture
                                ) -> None:
    db = str(catalog.location)
    catalog.close()
    assert main(["--catalog", db, "replay", done["merge_id"], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["match"] is True and out["merge_id"] == done["merge_id"]
    cat = Catalog(db)
    with cat.transaction() as conn:
        conn.execute(SQL("UPDATE output_tensors SET content_hash = 'x' WHERE merge_id = :m "
                             "AND tensor = 'lm_head.weight'"), {"m": done["merge_id"]})
    cat.close()
    assert main(["--catalog", db, "replay", done["merge_id"]]) == 1
    text = capsys.readouterr().out
    assert "MISMATCH" in text and "differs: lm_head.weight" in text
    assert main(["--catalog", db, "replay", "m-000000000000"]) == 2
    assert "not found" in capsys.readouterr().err


def test_replay_refuses_unknown_and_unfinished_merges(catalog: Catalog, done: dict) -> None:
    with pytest.raises(NotFound):
        replay(catalog, "m-nope")
    with catalog.transaction() as conn:
        conn.execute(SQL("UPDATE merges SET status = 'failed' WHERE merge_id = :m"),
                     {"m": done["merge_id"]})
    with pytest.raises(Conflict, match="only succeeded merges"):
        replay(catalog, done["merge_id"])
