"""Defaults never trade exactness (issue 28): the default strategy is the standard merge whatever
merges the catalog holds, a budget is a share of the scratch full read for every strategy, an
explicit incremental merge at the full budget is complete or refused, the manifest and the
catalog tell the same story, and a budget that reads no expert byte is refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.dialect import is_postgres
from mergepipe.catalog.ingest import ingest_model
from mergepipe.catalog.records import get_merge
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.jobs.merge import merge, run_merge, submit_merge
from mergepipe.jobs.planning import plan_merge
from mergepipe.jobs.report import MergeSummary
from tests import factory
from tests.api_helpers import assert_error, client_for, register_family, settings_for
from tests.api_helpers import make_family as api_family
from tests.catalogs import copy_catalog, new_catalog
from tests.executor_family import ingest_family

K = 6


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path | str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("exact")
    db = new_catalog(root)
    with Catalog(db) as cat:
        paths = ingest_family(cat, root / "fam", kinds=("full",) * K, block_bytes=1024)
    return db, paths


@pytest.fixture
def cat(fam: tuple[Path | str, dict[str, Path]], tmp_path: Path) -> Iterator[Catalog]:
    c = Catalog(copy_catalog(fam[0], tmp_path))
    yield c
    c.close()


def req(experts: str, op: str = "linear", **kw: object) -> MergeRequest:
    return build_request(base="base", experts=experts, operator=op, **kw)  # type: ignore[arg-type]


def weights(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.glob("*.safetensors"))}


def test_the_default_is_the_scratch_merge_whatever_the_catalog_holds(
        fam: tuple[Path | str, dict[str, Path]], cat: Catalog, tmp_path: Path) -> None:
    """The issue's case: a stored `e0,e1:0.5,e2`, then `e0,e1` with no strategy and no budget."""
    with Catalog(copy_catalog(fam[0], tmp_path, "fresh")) as fresh:
        alone = merge(fresh, req("e0,e1"), tmp_path / "alone")
    merge(cat, req("e0,e1:0.5,e2"), tmp_path / "stored")
    plan = plan_merge(cat, req("e0,e1"))
    assert plan.strategy is not None and plan.strategy["chosen"] == "scratch"
    assert plan.strategy["requested"] == "scratch" and plan.omission_bound == 0
    again = merge(cat, req("e0,e1"), tmp_path / "again")
    assert (again.strategy, again.previous_merge) == ("scratch", None)
    assert again.output_hash == alone.output_hash
    assert weights(tmp_path / "again") == weights(tmp_path / "alone")


def test_incremental_at_the_full_budget_is_complete_or_refused(
        cat: Catalog, tmp_path: Path) -> None:
    merge(cat, req("e0,e1:0.5,e2"), tmp_path / "stored")
    # the increment reads the stored merge, e1 and e2: more than scratch's e0 and e1
    with pytest.raises(InvalidRequest, match="at the full budget: the increment from merge "
                                             r"m-\w+ needs \d+ expert bytes .* would leave "
                                             "blocks out") as e:
        plan_merge(cat, req("e0,e1", strategy="incremental"))
    assert e.value.field == "strategy"
    auto = plan_merge(cat, req("e0,e1", strategy="auto")).strategy
    assert auto is not None and auto["chosen"] == "scratch"
    assert "would leave blocks out" in auto["incremental"]["reason"]
    # under a budget the user asked for, an incomplete increment stays allowed (and says so)
    half = plan_merge(cat, req("e0,e1", strategy="incremental", budget=0.5))
    assert half.strategy is not None and not half.strategy["incremental"]["complete"]


def test_a_budget_is_a_share_of_the_scratch_full_read_for_every_strategy(
        cat: Catalog, tmp_path: Path) -> None:
    merge(cat, req("e0,e1,e2"), tmp_path / "m3")
    scratch = plan_merge(cat, req("e0,e1,e2,e3", budget=0.6))
    inc = plan_merge(cat, req("e0,e1,e2,e3", budget=0.6, strategy="incremental"))
    assert inc.strategy is not None and inc.strategy["chosen"] == "incremental"
    assert inc.full_read_bytes == scratch.full_read_bytes  # the budget's unit
    assert inc.budget_bytes == scratch.budget_bytes == int(0.6 * scratch.full_read_bytes)
    own = inc.strategy["incremental"]["full_read_bytes"]  # m3 + e3: what it reads at most
    assert own < scratch.full_read_bytes and inc.strategy["budget_of"] == "the scratch full read"
    assert inc.touched_ratio == inc.planned_expert_bytes / scratch.full_read_bytes


def test_a_budgeted_stored_merge_is_not_reused_at_the_full_budget(
        cat: Catalog, tmp_path: Path) -> None:
    merge(cat, req("e0,e1,e2", budget=0.5, output_dtype="F32"), tmp_path / "half")
    with pytest.raises(InvalidRequest, match="read under a budget: an increment of it is not "
                                             "the standard merge"):
        plan_merge(cat, req("e0,e1,e2,e3", strategy="incremental", output_dtype="F32"))
    # at a budget of its own the omission is carried, as before
    p = plan_merge(cat, req("e0,e1,e2,e3", strategy="incremental", output_dtype="F32",
                            budget=0.9))
    assert p.strategy is not None and p.strategy["chosen"] == "incremental"


def _rows(cat: Catalog, sql: str, merge_id: str) -> list[tuple[object, ...]]:
    with cat.reader() as conn:
        return [tuple(r) for r in conn.execute(SQL(sql), {"m": merge_id}).fetchall()]


@pytest.mark.parametrize("strategy", ["incremental", "scratch"])
def test_the_manifest_and_the_catalog_agree(cat: Catalog, tmp_path: Path, strategy: str) -> None:
    merge(cat, req("e0,e1,e2,e3,e5"), tmp_path / "m5")
    # from m5: e1 reweighted, e4 added, e5 dropped (m5, e1, e4, e5: fewer than the 5 experts)
    asked = req("e0,e1:2,e2,e3,e4", params={"normalize": True}, strategy=strategy)
    r = merge(cat, asked, tmp_path / "out")
    assert r.strategy == strategy and r.merge_id is not None
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())
    row = get_merge(cat, r.merge_id)
    # the request: the user's, in the manifest and in merges.request
    assert doc["request"] == asked.to_dict() == row.request
    assert (doc["operator"], doc["params"], doc["seed"]) == ("linear", asked.params, 0)
    # the executed algebra, labelled, and the same in the catalog's plan and merge_experts
    executed = doc["executed"]["request"]
    assert doc["executed"]["strategy"] == strategy
    if strategy == "scratch":
        assert executed == asked.to_dict()
    else:
        assert row.plan is not None
        assert executed == row.plan["strategy"]["executed_request"]
        assert executed["experts"][0]["model"] == "m5"  # m5 x c, then the changed experts
        assert {e["model"] for e in executed["experts"][1:]} == {"e1", "e4", "e5"}
    assert [(e["model"], e["weight"]) for e in doc["experts"]] == [
        (m, w) for m, w in _rows(cat, "SELECT model, weight FROM merge_experts WHERE "
                                      "merge_id = :m ORDER BY position", r.merge_id)]
    assert [(e["model"], e["weight"]) for e in doc["experts"]] == [
        (e["model"], e["weight"]) for e in executed["experts"]]
    # the lineage: what the user asked (and the merge reused, role previous), both places
    edges = sorted((p, role, w) for p, role, w in _rows(
        cat, "SELECT parent, role, weight FROM lineage WHERE child = 'out'", r.merge_id))
    assert sorted((e["parent"], e["role"], e["weight"]) for e in doc["lineage"]) == edges
    expected: list[tuple[str, str, object]] = [  # object: a weight, None or pytest.approx
        ("base", "base", None), ("e0", "expert", 1.0), ("e1", "expert", 2.0),
        ("e2", "expert", 1.0), ("e3", "expert", 1.0), ("e4", "expert", 1.0)]
    if strategy == "incremental":
        expected.append(("m5", "previous", pytest.approx(5 / 6)))
    assert edges == sorted(expected, key=lambda e: (e[0], e[1]))


# -- a budget that reads no expert byte ---------------------------------------------------------

@pytest.mark.parametrize(("op", "params"), [("linear", {}), ("ties", {"density": 0.5})])
def test_a_budget_that_reads_no_expert_byte_is_refused_naming_the_smallest_useful_one(
        cat: Catalog, op: str, params: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest, match=r"smallest useful budget is (\d+)B") as e:
        plan_merge(cat, req("e0,e1,e2", op, params=params, budget="1B"))
    assert e.value.field == "budget" and "reads no expert byte" in e.value.message
    smallest = int(e.value.message.rsplit(" ", 1)[1].removesuffix("B"))
    # that budget reads something; one byte less reads nothing and is refused the same way
    assert plan_merge(cat, req("e0,e1,e2", op, params=params,
                               budget=f"{smallest}B")).planned_expert_bytes > 0
    with pytest.raises(InvalidRequest, match=f"smallest useful budget is {smallest}B"):
        plan_merge(cat, req("e0,e1,e2", op, params=params, budget=f"{smallest - 1}B"))
    # a merge is refused before it is queued: no merge row
    with pytest.raises(InvalidRequest, match=f"smallest useful budget is {smallest}B"):
        submit_merge(cat, req("e0,e1,e2", op, params=params, budget="1B"), "x", "/tmp/unused-x")
    with cat.reader() as conn:
        assert conn.execute(SQL("SELECT count(*) FROM merges")).scalar_one() == 0


def test_experts_equal_to_the_base_merge_to_the_base(
        fam: tuple[Path | str, dict[str, Path]], cat: Catalog, tmp_path: Path) -> None:
    """Nothing differs from the base: nothing to read at any budget, and the merge is exact."""
    ingest_model(cat, fam[1]["base"], "same", base="base")
    plan = plan_merge(cat, req("same", "task_arithmetic", budget="1B"))
    assert (plan.full_read_bytes, plan.planned_expert_bytes) == (0, 0)
    merge(cat, req("same", "task_arithmetic"), tmp_path / "out")
    out, base = factory.load(tmp_path / "out"), factory.load(fam[1]["base"])
    assert set(out) == set(base) and all(bool((out[n] == base[n]).all()) for n in base)


def test_cli_refuses_an_empty_budget_in_one_line(
        fam: tuple[Path | str, dict[str, Path]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from mergepipe.cli.main import main
    db = str(copy_catalog(fam[0], tmp_path))
    args = ["--base", "base", "--experts", "e0,e1", "--op", "task_arithmetic", "--budget", "1B"]
    for cmd in (["plan"], ["merge", "--out", str(tmp_path / "out")]):
        assert main(["--catalog", db, *cmd, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "smallest useful budget is" in err, err
    assert not (tmp_path / "out").exists()


def test_api_refuses_an_empty_budget_with_a_422(tmp_path: Path) -> None:
    family = api_family(tmp_path / "data" / "family")
    with client_for(settings_for(tmp_path)) as client:
        register_family(client, family)
        body = {"base": "base", "experts": [{"model": "e0"}, {"model": "e1"}],
                "operator": "task_arithmetic", "budget": {"bytes": 1}}
        for path, extra in (("/v1/plans", {}), ("/v1/merges", {"output": {"name": "o"}})):
            err = assert_error(client.post(path, json={**body, **extra}), 422,
                               "invalid_request", "budget")
            assert "smallest useful budget is" in err["message"]
        assert client.get("/v1/merges").json()["merges"] == []


# -- identical requests, identical bytes ---------------------------------------------------------

def test_identical_requests_give_identical_bytes_whatever_merges_are_stored(
        fam: tuple[Path | str, dict[str, Path]], cat: Catalog, tmp_path: Path) -> None:
    """Two identical task_arithmetic requests run at once (two runners, as two replicas would)
    on a catalog holding merges they could be built from, and the same request on a catalog
    holding none: the same bytes."""
    ta = "e0,e1:0.5,e2:-0.25,e3"
    with Catalog(copy_catalog(fam[0], tmp_path, "fresh")) as fresh:
        alone = merge(fresh, req(ta, "task_arithmetic"), tmp_path / "alone")
    merge(cat, req("e0,e1:0.5,e2:-0.25", "task_arithmetic"), tmp_path / "s1")
    merge(cat, req("e0,e1:0.5,e3,e4", "task_arithmetic"), tmp_path / "s2")
    ids = [submit_merge(cat, req(ta, "task_arithmetic"), f"r{i}", tmp_path / f"r{i}").merge_id
           for i in range(2)]
    results: dict[str, MergeSummary] = {}
    shared = is_postgres(str(cat.location))  # PostgreSQL: a second catalog, as a replica
    second = Catalog(cat.location) if shared else cat

    def run(c: Catalog, merge_id: str | None) -> None:
        assert merge_id is not None
        results[merge_id] = run_merge(c, merge_id)

    threads = [threading.Thread(target=run, args=(c, m)) for c, m in zip((cat, second), ids,
                                                                           strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if second is not cat:
        second.close()
    assert len(results) == 2
    for i, m in enumerate(ids):
        assert m is not None
        assert weights(tmp_path / f"r{i}") == weights(tmp_path / "alone")
        assert results[m].output_hash == alone.output_hash and results[m].strategy == "scratch"
