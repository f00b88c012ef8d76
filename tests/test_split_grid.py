"""1-D tensors and tensors with rows larger than a block are cut into element ranges: ingestion,
statistics, TIES thresholds, planning, merges and registered outputs agree with one-block grids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge
from mergepipe.storage.grid import block_rows, is_element_grid, unit_numel
from tests import factory
from tests.catalogs import new_catalog

SHAPES = {"wide.weight": (2, 1500), "norm.weight": (3000,), "proj.weight": (40, 24),
          "scalar": ()}
SMALL = 1024  # bytes: wide's rows (3000 B) and norm (6000 B) are cut into element ranges
EXPERTS = "e0,e1:0.5,e2:2"


def test_grid_cuts_1d_and_wide_rows_into_element_ranges() -> None:
    assert block_rows((3000,), 2, 1024) == [(0, 500), (500, 1000), (1000, 1500), (1500, 2000),
                                             (2000, 2500), (2500, 3000)]
    wide = block_rows((2, 1500), 2, 1024)
    assert wide[0] == (0, 500) and wide[-1][1] == 3000 and len(wide) == 6
    assert is_element_grid((2, 1500), 3000) and unit_numel((2, 1500), 3000) == 1
    rows = block_rows((40, 24), 2, 1024)  # rows of 48 B: a row grid, as before
    assert rows[-1][1] == 40 and not is_element_grid((40, 24), 40)
    assert unit_numel((40, 24), 40) == 24
    assert block_rows((), 4, 64) == [(0, 1)] and block_rows((0,), 2, 64) == [(0, 0)]
    assert block_rows((7,), 2, 1024) == [(0, 7)]  # small: one block, as before
    for shape in [(3000,), (2, 1500), (40, 24), (5, 0), (0, 3), (1, 1, 9000)]:
        grid = block_rows(shape, 2, 1024)
        assert grid[0][0] == 0 and all(a[1] == b[0] for a, b in zip(grid, grid[1:], strict=False))
        units = grid[-1][1]
        assert all((e - s) * unit_numel(shape, units) * 2 <= 1024 for s, e in grid) or \
            len(grid) == 1


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One family ingested twice: with small blocks (element grids) and with one block per
    tensor (the grid of before)."""
    root = tmp_path_factory.mktemp("split")
    base = factory.save_checkpoint(root / "base", factory.random_weights(SHAPES, 0), "BF16")
    experts = [factory.make_expert(base, root / f"e{i}", seed=10 + i) for i in range(3)]
    cats = {}
    for label, bb in (("small", SMALL), ("one", 1 << 20)):
        cat = Catalog(new_catalog(root, label))
        ingest_model(cat, base, "base", block_bytes=bb)
        for i, e in enumerate(experts):
            ingest_model(cat, e, f"e{i}", base="base")
        cats[label] = cat
    yield {"root": root, "base": base, **cats}
    for cat in cats.values():
        cat.close()


def _q(cat: Catalog, sql: str) -> list[tuple]:
    return [tuple(r) for r in cat.query(SQL(sql))]


def test_small_grid_has_element_blocks_and_same_statistics(two: dict) -> None:
    small, one = two["small"], two["one"]
    n = dict(_q(small, "SELECT tensor, count(*) FROM blocks WHERE model = 'e0' GROUP BY 1"))
    assert n["norm.weight"] == 6 and n["wide.weight"] == 6 and n["scalar"] == 1
    spans = _q(small, "SELECT row_start, row_end, byte_offset, nbytes FROM blocks WHERE "
                      "model = 'base' AND tensor = 'wide.weight' ORDER BY block_index")
    assert all(nb == (e - s) * 2 for s, e, _, nb in spans)
    assert all(a[2] + a[3] == b[2] for a, b in zip(spans, spans[1:], strict=False))  # contiguous bytes
    # Per-tensor statistics and TIES thresholds do not depend on the grid.
    sql = ("SELECT tensor, numel, nnz, max_abs, trim_tau, trim_above, trim_tied FROM "
           "tensor_stats WHERE model = 'e1' ORDER BY tensor")
    assert _q(small, sql) == _q(one, sql)
    sql = "SELECT l2, l1 FROM tensor_stats WHERE model = 'e1' ORDER BY tensor"
    for ra, rb in zip(_q(small, sql), _q(one, sql), strict=True):
        assert ra == pytest.approx(rb, rel=1e-5)
    l2 = ("SELECT tensor, sqrt(sum(l2 * l2)), sum(l1), max(max_abs), sum(nnz) FROM block_stats "
          "WHERE model = 'e2' GROUP BY 1 ORDER BY 1")
    for ra, rb in zip(_q(small, l2), _q(one, l2), strict=True):
        assert ra[0] == rb[0] and ra[3:] == rb[3:]
        assert ra[1:3] == pytest.approx(rb[1:3], rel=1e-5)


@pytest.mark.parametrize("op,params", [("linear", {}), ("task_arithmetic", {"lambda": 0.7}),
                                       ("ties", {"density": 0.5})])
def test_full_budget_outputs_are_bit_identical_across_grids(two: dict, tmp_path: Path, op: str,
                                                            params: dict) -> None:
    outs = {}
    for label in ("small", "one"):
        req = build_request(base="base", experts=EXPERTS, operator=op, budget=1.0,
                            params=params)
        r = merge(two[label], req, tmp_path / label, output_name=f"{op}-{label}").to_dict()
        assert r["expert_bytes_read"] == r["planned_expert_bytes"]
        outs[label] = r["output_hash"]
    assert outs["small"] == outs["one"]
    assert ((tmp_path / "small" / "model.safetensors").read_bytes()
            == (tmp_path / "one" / "model.safetensors").read_bytes())


def test_budgeted_merge_reads_element_blocks_and_registers_its_output(two: dict,
                                                                      tmp_path: Path) -> None:
    cat = two["small"]
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=0.3)
    r = merge(cat, req, tmp_path / "m", output_name="budgeted").to_dict()
    assert 0 < r["expert_bytes_read"] <= r["budget_bytes"]
    touched = _q(cat, "SELECT DISTINCT tensor FROM touched_blocks WHERE merge_id = "
                      f"'{r['merge_id']}'")
    assert {"norm.weight", "wide.weight"} & {t for (t,) in touched}
    # The registered output's statistics are those of ingesting the written file afresh.
    ingest_model(cat, tmp_path / "m", "again", base="base")
    sql = ("SELECT tensor, block_index, l2, l1, max_abs, nnz FROM block_stats WHERE model = '{}' "
           "ORDER BY 1, 2")
    assert _q(cat, sql.format("budgeted")) == _q(cat, sql.format("again"))
    out, base = factory.load(tmp_path / "m"), factory.load(two["base"])
    assert out.keys() == base.keys()


def test_lora_on_a_tensor_with_rows_larger_than_a_block_is_refused(tmp_path: Path) -> None:
    shapes: dict[str, tuple[int, ...]] = {"layers.0.self_attn.q_proj.weight": (4, 1024),
                                          "other.weight": (8, 8)}
    base = factory.save_checkpoint(tmp_path / "b", factory.random_weights(shapes, 0), "BF16")
    lora = factory.make_lora(base, tmp_path / "l", seed=1, targets=("q_proj",))
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest_model(cat, base, "base", block_bytes=1024)
        with pytest.raises(InvalidCheckpoint, match="q_proj.*not supported.*block size"):
            ingest_model(cat, lora, "l", base="base", kind="lora")
        assert _q(cat, "SELECT count(*) FROM models WHERE name = 'l'") == [(0,)]


def test_base_grid_is_taken_by_experts_of_any_dtype(tmp_path: Path) -> None:
    base = factory.save_checkpoint(tmp_path / "b", factory.random_weights(SHAPES, 3), "BF16")
    e = factory.make_expert(base, tmp_path / "e", seed=4, dtype="F32")
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest_model(cat, base, "base", block_bytes=SMALL)
        ingest_model(cat, e, "e", base="base")
        q = ("SELECT tensor, block_index, row_start, row_end, nbytes FROM blocks WHERE model = "
             "'{}' ORDER BY 1, 2")
        b, x = _q(cat, q.format("base")), _q(cat, q.format("e"))
        assert [r[:4] for r in b] == [r[:4] for r in x]
        assert [r[4] * 2 for r in b] == [r[4] for r in x]  # F32 blocks are twice the bytes
