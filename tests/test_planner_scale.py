"""Planner on synthetic catalogs of many equal blocks (planner.bench): counts and soundness."""

from __future__ import annotations

import pytest

from mergepipe.benchmarks import planner_bench as bench
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
