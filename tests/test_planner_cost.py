"""What a plan costs the catalog: few statements, none whose answer is already known, and the
access digest computed outside SQL exactly as the catalog's sha256 of its lines."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog.connection import SQL, Connection, Result
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.core.request import build_request
from mergepipe.planner import knapsack
from mergepipe.planner.plan import _candidates, make_plan
from tests.planner_rows import Blk, Model, Ten, add_model, base_like

# e0: blocks of 100 B (the fallback expert "f" has the same tensors, without statistics)
E0 = [Ten("t0", [Blk(100, 4), Blk(100, 3), Blk(100, 1)], tau=0.5),
      Ten("t1", [Blk(100, 2), Blk(40, 1)], tau=0.5)]
E1 = [Ten("t0", [Blk(100, 6), Blk(100, 2), Blk(100, 2)], tau=0.5),
      Ten("t1", [Blk(100, 5), Blk(40, 3)], tau=0.5)]

# The access digest as the planner computed it in SQL before (the reference).
OLD_ACCESS = SQL("""
CREATE OR REPLACE TEMP TABLE old_access AS
WITH selected AS (
    SELECT c.*, r.model
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    WHERE c.cumulative <= CAST(:budget AS BIGINT) OR c.pass IS NOT NULL
)
SELECT s.unit_rank, s.model, s.tensor, s.block_index, b.content_hash
FROM selected s
JOIN blocks b ON b.model = s.model AND b.tensor = s.tensor AND b.block_index = s.block_index
WHERE NOT s.fallback
UNION ALL
SELECT s.unit_rank, s.model, s.tensor, b.block_index, b.content_hash
FROM selected s
JOIN blocks b ON b.model = s.model AND b.tensor = s.tensor
WHERE s.fallback""")
OLD_DIGEST = SQL("""
SELECT sha256(COALESCE(string_agg(
           model || chr(31) || tensor || chr(31) || CAST(block_index AS VARCHAR) || chr(31)
           || content_hash, chr(10) ORDER BY unit_rank, block_index), ''))
FROM old_access""")


class Counting:
    """A catalog connection that counts the named planner statements it runs."""

    def __init__(self, conn: Connection, names: dict[str, str], seen: Counter[str]) -> None:
        self.conn, self.names, self.seen = conn, names, seen

    def execute(self, statement: SQL, params: Any = None) -> Result:
        self.seen[self.names.get(statement.text, "other")] += 1
        return self.conn.execute(statement, params)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The statements make_plan runs, by SQL file name (reset by the test when needed)."""
    names = {}
    for n in ("planner_models", "planner_candidates",
              "planner_full_read", "planner_missing_stats", "planner_prefix",
              "planner_fill_pass", "planner_fill_pass_group", "planner_fill_pass_plain",
              "planner_fill_pass_group_plain", "planner_totals",
              "planner_omission_l2", "planner_access", "planner_trims", "planner_content_digest",
              "planner_lora_identity", "planner_request_create", "planner_tensor_params_create",
              "planner_cheapest_unit", "planner_smallest_left"):
        with contextlib.suppress(KeyError):  # (a statement of another version of the planner)
            names[load_sql(n).text] = n
    seen: Counter[str] = Counter()
    reader = Catalog.reader

    @contextmanager
    def counting_reader(self: Catalog) -> Iterator[Connection]:
        with reader(self) as conn:
            yield Counting(conn, names, seen)

    monkeypatch.setattr(Catalog, "reader", counting_reader)
    return seen


def fill_passes(counted: Counter[str]) -> int:
    return sum(n for name, n in counted.items() if name.startswith("planner_fill_pass"))


def family(cat: Catalog, *, fallback: bool = False) -> None:
    add_model(cat, base_like("B", E0))
    add_model(cat, Model("e0", E0, base="B"))
    add_model(cat, Model("e1", E1, base="B"))
    if fallback:
        add_model(cat, Model("f", E0, base="B", has_stats=False))


def plan(cat: Catalog, budget: str, op: str = "linear", experts: str = "e0,e1",
         **params: Any) -> Any:
    # the hand-computed orders rank by l2, linear's default before issue 31 (now per_tensor)
    if op in ("linear", "task_arithmetic"):
        params.setdefault("utility", "l2")
    return make_plan(cat, build_request(base="B", experts=experts, operator=op, params=params,
                                        budget=budget))


def test_a_plan_whose_prefix_fills_the_budget_runs_no_fill_pass(catalog: Catalog,
                                                                counted: Counter[str]) -> None:
    family(catalog)
    # ranked by l2 per byte: e1/t0/0 (6/100), e1/t1/1 (3/40), e1/t1/0, e0/t0/0, ...: the first
    # two cost exactly 140 B, and every unit left costs more than the 0 B left over
    p = plan(catalog, "140B")
    assert [(b.model, b.tensor, b.block_index) for b in p.blocks] == [
        ("e1", "t1", 1), ("e1", "t0", 0)]
    assert p.planned_expert_bytes == 140
    assert fill_passes(counted) == 0
    # linear: no trim thresholds to read, no missing statistics to name; one access query
    assert counted["planner_trims"] == counted["planner_missing_stats"] == 0
    assert counted["planner_access"] == 1
    # 30 B are left after the prefix of 240 B, and the smallest unit left costs 40 B: no pass
    counted.clear()
    assert plan(catalog, "270B").planned_expert_bytes == 240
    assert fill_passes(counted) == 0


def test_fill_passes_run_while_they_add_units(catalog: Catalog, counted: Counter[str]) -> None:
    family(catalog)
    # 290 B: the prefix e1/t1/1, e1/t0/0, e1/t1/0 (240 B); the next unit, e0/t0/0 (100 B),
    # does not fit the 50 B left; one pass takes e0/t1/1 (40 B), the only unit that fits, and
    # no second pass runs: 10 B are left and every unit left costs more
    p = plan(catalog, "290B")
    assert p.planned_expert_bytes == 280
    assert ("e0", "t1", 1) in {(b.model, b.tensor, b.block_index) for b in p.blocks}
    assert fill_passes(counted) == 1
    # 330 B: the same prefix, 90 B left; the pass takes e0/t1/1 and leaves 50 B, more than the
    # 40 B of the smallest unit left out before it: the smallest is read again (100 B) instead
    # of a second pass that would find nothing
    counted.clear()
    assert plan(catalog, "330B").planned_expert_bytes == 280
    assert fill_passes(counted) == 1 and counted["planner_smallest_left"] == 1


def test_the_base_digest_is_read_once_per_model_row(catalog: Catalog,
                                                    counted: Counter[str]) -> None:
    family(catalog)
    first = plan(catalog, "140B")
    assert counted["planner_content_digest"] == 1
    again = plan(catalog, "140B")
    assert counted["planner_content_digest"] == 1  # cached: the base's blocks never change
    assert again.plan_hash == first.plan_hash


def test_a_base_of_the_same_name_in_another_catalog_is_read_again(
        tmp_path: Path, counted: Counter[str]) -> None:
    from tests.catalogs import new_catalog

    hashes = []
    for i, salt in enumerate(("", "changed")):
        with Catalog(new_catalog(tmp_path, f"c{i}")) as cat:
            base = base_like("B", E0)
            base.salt = salt
            add_model(cat, base)
            add_model(cat, Model("e0", E0, base="B"))
            add_model(cat, Model("e1", E1, base="B"))
            hashes.append(plan(cat, "140B").plan_hash)
    assert counted["planner_content_digest"] == 2
    assert hashes[0] != hashes[1]


@pytest.mark.parametrize(("op", "params", "budget", "fallback"), [
    ("linear", {}, "290B", False),
    ("linear", {}, "1500B", True),  # whole tensors of the fallback expert too
    ("ties", {"density": 0.5}, "300B", False),
    ("dare_ties", {"density": 0.5, "unit": "group"}, "500B", True),  # coherent groups
])
def test_the_access_digest_equals_the_catalogs_sha256_of_its_lines(
        catalog: Catalog, op: str, params: dict[str, Any], budget: str, fallback: bool) -> None:
    family(catalog, fallback=fallback)
    experts = "e0,e1,f" if fallback else "e0,e1"
    req = build_request(base="B", experts=experts, operator=op, params=params, budget=budget)
    with catalog.reader() as conn:
        c = _candidates(conn, str(catalog.location), req)
        b = req.budget.resolve(c.full_read)
        knapsack.select(conn, b, grouped=c.unit != "expert_block")
        rows, digest = knapsack.access_set(conn, b)
        conn.execute(OLD_ACCESS, {"budget": b})
        old = conn.execute(OLD_DIGEST).scalar_one()
    assert rows and len(digest) == 64
    assert digest == old
    if fallback:
        assert any(r[0] == "f" for r in rows)
