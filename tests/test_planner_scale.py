"""Planner on synthetic catalogs of many equal blocks (planner.bench): counts and soundness."""

from __future__ import annotations

from pathlib import Path

import pytest
from mergepipe_bench import planner_bench as bench

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.request import build_request
from mergepipe.planner.plan import make_plan

BLOCK = 1 << 20


def experts(k: int) -> str:
    return ",".join(f"e{i}" for i in range(1, k + 1))


def check(cat: Catalog, k: int, blocks_per_expert: int) -> None:
    full = make_plan(cat, build_request(base="base", experts=experts(k), operator="linear"))
    nonzero = cat.query(SQL("SELECT count(*) FROM block_stats WHERE l2 > 0"))[0][0]
    assert len(full.blocks) == full.candidate_blocks == nonzero
    assert full.full_read_bytes == full.planned_expert_bytes == nonzero * BLOCK
    tenth = make_plan(cat, build_request(base="base", experts=experts(k), operator="linear",
                                         budget=0.1))
    # Equal blocks: the greedy takes exactly floor(budget / block) blocks, the best first.
    assert len(tenth.blocks) == tenth.budget_bytes // BLOCK
    assert tenth.planned_expert_bytes <= tenth.budget_bytes
    assert [b.rank for b in tenth.blocks] == list(range(len(tenth.blocks)))
    worst_kept = min(b.utility for b in tenth.blocks)
    assert full.blocks[len(tenth.blocks)].utility <= worst_kept
    # ties at density 0.5: tau = 0.05 in the synthetic trim grid, max|delta| = l2 / 10.
    ties = make_plan(cat, build_request(base="base", experts=experts(k), operator="ties",
                                        params={"density": 0.5}))
    kept = cat.query(SQL("SELECT count(*) FROM block_stats WHERE l2 > 0 AND "
                             "max_abs >= 0.05"))[0][0]
    assert 0 < len(ties.blocks) == kept < nonzero


@pytest.mark.duckdb_only("the synthetic catalog builder (benchmarks.planner_bench) writes DuckDB "
                         "SQL: range(), hash(), list literals")
def test_synthetic_catalog(catalog: Catalog) -> None:
    bench.build(catalog, 3, 2000, n_tensors=20)
    check(catalog, 3, 2000)


@pytest.mark.slow
def test_sixteen_experts_of_twenty_thousand_blocks(catalog: Catalog) -> None:
    bench.build(catalog, 16, 20_000)
    check(catalog, 16, 20_000)


def test_bench_reports_the_planning_share_of_merges_of_a_real_family(
        tmp_path: Path, family: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from mergepipe.catalog.ingest import ingest_model
    from tests.catalogs import new_catalog

    location = new_catalog(tmp_path)
    with Catalog(location) as cat:
        ingest_model(cat, family["base"], "base", block_bytes=512)
        for name in ("e0", "e1", "e2"):
            ingest_model(cat, family[name], name, base="base", block_bytes=512)
    bench.main(["--catalog", str(location), "--base", "base", "--experts", "e0,e1,e2",
                "--out", str(tmp_path / "out"), "--repeat", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["linear", "ties"]
    for line in lines:
        share = float(line.rsplit("share ", 1)[1].rstrip("%"))
        assert 0 < share < 100
    # every run merged: the warm-up and the measured one of each operator
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "linear-0", "linear-1", "ties-0", "ties-1"]
