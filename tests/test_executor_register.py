"""A merge's output is registered from the executor's first scan pass: the same rows as
scanning the written output from its files, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from mergepipe.catalog import stats
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ScannedModel, scan_model
from mergepipe.core.request import build_request
from mergepipe.executor import stream
from mergepipe.jobs.merge import merge
from mergepipe.planner.plan import make_plan
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

ROW_TABLES = ("files", "tensors", "blocks", "block_stats", "tensor_stats")


def rows(s: ScannedModel) -> dict:
    model = {k: v for k, v in s.model.to_dict().items() if k != "ingest_seconds"}
    return {"model": model, **{t: getattr(s, t) for t in ROW_TABLES}}


def first_pass_and_rescan(cat: Catalog, request, out: Path, name: str
                          ) -> tuple[ScannedModel, ScannedModel]:
    """(registration rows from the executor's first pass, rows from scanning the files)."""
    prep = stream.prepare(cat, make_plan(cat, request))
    out.mkdir()
    result = stream.execute(prep, out, first_pass=True)
    assert set(result.first_passes) == set(prep.base.tensors)
    got = scan_model(cat, out, name, base=request.base, first_passes=result.first_passes)
    ref = scan_model(cat, out, name, base=request.base)
    return got, ref


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fams")
    cat = Catalog(new_catalog(root))
    ingest_family(cat, root / "bf16")
    ingest_family(cat, root / "f32", dtype="F32", prefix="f", seed=2)
    yield cat
    cat.close()


@pytest.mark.parametrize("prefix", ["", pytest.param("f", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("op", "budget", "params", "dtype"), [
    ("ties", 1.0, {"density": 0.5}, None),
    ("ties", 0.4, {"density": 0.3}, None),  # unread blocks: the base's own bytes
    ("dare_ties", 0.7, {"density": 0.5}, None),
    ("linear", 0.5, {}, "F32"),  # another output dtype: no block is the base's bytes
    ("task_arithmetic", 0.3, {}, "F16"),
])
def test_first_pass_rows_equal_the_scan_of_the_output(families, tmp_path, prefix, op, budget,
                                                      params, dtype):
    req = build_request(base=f"{prefix}base", experts=f"{prefix}e0,{prefix}e1:0.5,{prefix}e2",
                        operator=op, budget=budget, params=params, seed=4, output_dtype=dtype)
    got, ref = first_pass_and_rescan(families, req, tmp_path / "out", "out")
    assert rows(got) == rows(ref)
    assert ref.block_stats is not None and any(x > 0 for x in ref.block_stats["nnz"])
    assert got.bytes_read == 0  # nothing read again: every threshold resolved at level 0


def test_tensors_whose_thresholds_need_refinement_are_scanned_from_the_files(
        families, tmp_path, monkeypatch):
    monkeypatch.setattr(stats, "MIXED_CAP", 0)  # level 0 cannot resolve mixed bins: refine
    req = build_request(base="fbase", experts="fe0,fe1,fe2", operator="ties", budget=1.0,
                        params={"density": 0.5})
    got, ref = first_pass_and_rescan(families, req, tmp_path / "out", "out")
    assert rows(got) == rows(ref)
    assert 0 < got.bytes_read < ref.bytes_read  # one-block tensors resolve in memory


def test_a_merge_registers_its_output_with_the_rows_of_a_rescan(families, tmp_path):
    req = build_request(base="base", experts="e0,e1,e2", operator="ties", budget=0.6,
                        params={"density": 0.4})
    r = merge(families, req, tmp_path / "m", output_name="m").to_dict()
    ref = scan_model(families, tmp_path / "m", "m-rescan", base="base", source_merge=r["merge_id"])
    for table in ("blocks", "block_stats", "tensor_stats"):
        cols = list(getattr(ref, table))
        stored = families.query(SQL(
            f"SELECT {', '.join(cols)} FROM {table} WHERE model = 'm' "  # noqa: S608 - test
            f"ORDER BY {'tensor, block_index' if table != 'tensor_stats' else 'tensor'}"))
        want = sorted(zip(*getattr(ref, table).values(), strict=True),
                      key=lambda row: tuple(row[:2]) if table != "tensor_stats" else row[0])
        assert [tuple(x) for x in stored] == [tuple(x) for x in want], table
