"""`mergepipe bench --large`'s row, on a tiny family: it generates and ingests once, reuses both,
and reports planning against the merge for linear and ties with the same plan every run."""

from __future__ import annotations

import json
from pathlib import Path

from mergepipe_bench.large_family import run_large, setup

from mergepipe.cli.family import LlamaShape, read_family

TINY = LlamaShape(hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1, vocab=256)


def test_the_large_row_measures_both_operators_and_reuses_its_family(tmp_path: Path) -> None:
    logs: list[str] = []
    first = run_large(tmp_path, 1, logs.append, shape=TINY, experts=2)
    assert [r["operator"] for r in first["rows"]] == ["linear", "ties"]
    for r in first["rows"]:
        assert r["runs"] == 1 and len(r["plan_hashes"]) == 1
        assert 0 < r["plan_s"] < r["wall_s"] and r["share"] == r["plan_s"] / r["wall_s"]
        assert r["accept_s"] > 0 and r["share_with_accept"] > r["share"]
    assert not first["setup"]["reused"] and first["setup"]["generate_s"] > 0
    md = (tmp_path / "large-family.md").read_text()
    assert "K = 2 experts" in md and md.count("| 0.1 |") == 2
    assert "| under 2% |" in md
    shares = ", ".join(f"{r['operator']} {100 * r['share']:.2f}%" for r in first["rows"])
    assert f"target under 2%): {shares}." in md
    assert json.loads((tmp_path / "large-family.json").read_text())["rows"] == first["rows"]
    assert not (tmp_path / "work" / "large-runs" / "linear-1").exists()  # outputs removed
    root, catalog, info = setup(tmp_path / "work", logs.append, shape=TINY, experts=2)
    assert info["reused"] and catalog.exists() and root == catalog.parent
    _, _, info = setup(tmp_path / "work", logs.append, shape=TINY, experts=1)  # another family
    assert not info["reused"] and len(read_family(root)["experts"]) == 1


def test_the_scaled_family_has_the_large_familys_rows(tmp_path: Path) -> None:
    from mergepipe_bench.large_family import SHAPE
    from mergepipe_bench.planning_rows import measure, scaled, setup

    from mergepipe.catalog.connection import SQL
    from mergepipe.catalog.db import Catalog
    from mergepipe.storage.grid import block_rows

    small = scaled(SHAPE, 32)  # hidden 64: same tensors; blocks 32^2 times smaller
    assert [n for n, _ in small.tensors()] == [n for n, _ in SHAPE.tensors()]
    catalog, experts = setup(tmp_path, shape=small, experts=2, block_bytes=(1 << 20) // 32 ** 2)
    want = sum(len(block_rows(s, 2, 1 << 20)) for _, s in SHAPE.tensors())
    with Catalog(catalog) as cat, cat.reader() as conn:
        n = conn.execute(SQL("SELECT count(*) FROM blocks WHERE model = 'base'")).scalar_one()
    assert n == want == 1659
    rows = measure(catalog, experts, 1)
    assert [r["operator"] for r in rows] == ["linear", "ties"]
    for r in rows:
        assert 0 < r["plan_cpu_s"] <= r["plan_seconds_cpu_s"] and r["blocks"] > 0
