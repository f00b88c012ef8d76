"""Planner on catalogs built by real ingestion of factory checkpoints (full, LoRA, no stats)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from mergepipe.catalog.connection import SQL, Row
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.request import build_request
from mergepipe.planner.plan import Plan, make_plan
from tests import factory
from tests.catalogs import new_catalog

BLOCK = 512  # bytes: several blocks per tensor of the tiny family

STATS = SQL("""
SELECT s.model, s.tensor, s.block_index, b.nbytes, s.l2, s.max_abs, ts.trim_tau[CAST(:j AS INTEGER)] AS tau
FROM block_stats s
JOIN blocks b USING (model, tensor, block_index)
JOIN tensor_stats ts USING (model, tensor)
WHERE s.model = :model""")


def ingest_family(cat: Catalog, family: dict[str, Path], *, stats: bool = True) -> None:
    ingest_model(cat, family["base"], "base", block_bytes=BLOCK)
    for name in ("e0", "e1", "e2"):
        ingest_model(cat, family[name], name, base="base", block_bytes=BLOCK, with_stats=stats)


def blocks_of(cat: Catalog, model: str, density: float = 0.5) -> list[Row]:
    return cat.query(STATS, {"model": model, "j": round(density * 100)})


def plan(cat: Catalog, op: str = "linear", budget: str | float | dict[str, Any] | None = None,
         experts: str = "e0,e1:0.5,e2:2", **params: object) -> Plan:
    return make_plan(cat, build_request(base="base", experts=experts, operator=op,
                                        params=params, budget=budget))


def test_full_budget_reads_every_nonzero_block(catalog: Catalog, family: dict[str, Path]) -> None:
    ingest_family(catalog, family)
    p = plan(catalog)
    rows = [r for m in ("e0", "e1", "e2") for r in blocks_of(catalog, m)]
    nonzero = {(r.model, r.tensor, r.block_index) for r in rows if r.l2 > 0}
    assert {(b.model, b.tensor, b.block_index) for b in p.blocks} == nonzero
    assert p.full_read_bytes == p.planned_expert_bytes == sum(
        r.nbytes for r in rows if r.l2 > 0)
    # e0 keeps model.norm.weight untouched: its zero delta is never read.
    assert ("e0", "model.norm.weight") not in p.selected()
    assert ("e1", "model.norm.weight") in p.selected()
    assert p.omission_bound == 0.0 and p.fallback_experts == []


def test_bound_is_the_utility_of_the_omitted_blocks(catalog: Catalog,
                                                   family: dict[str, Path]) -> None:
    ingest_family(catalog, family)
    p = make_plan(catalog, build_request(base="base", experts="e0,e1:0.5,e2:2",
                                         operator="task_arithmetic",
                                         # l2: the ranking whose prefix is checked below
                                         params={"lambda": 0.5, "utility": "l2"},
                                         budget=0.3))
    assert 0 < p.planned_expert_bytes <= p.budget_bytes == int(0.3 * p.full_read_bytes)
    alpha = {"e0": 0.5, "e1": 0.25, "e2": 1.0}
    chosen = {(b.model, b.tensor, b.block_index) for b in p.blocks}
    omitted = [alpha[m] * r.l2 for m in alpha for r in blocks_of(catalog, m)
               if (m, r.tensor, r.block_index) not in chosen]
    assert p.omission_bound == pytest.approx(sum(omitted), rel=1e-9)
    # The ranked prefix has the highest utility per byte.
    per_byte = [b.utility / b.nbytes for b in p.blocks]
    assert per_byte[0] == max(alpha[m] * r.l2 / r.nbytes for m in alpha
                              for r in blocks_of(catalog, m))


def test_ties_full_read_excludes_blocks_below_the_trim(catalog: Catalog, tmp_path: Path) -> None:
    # F32 family whose deltas are large in the first 8 rows of each tensor and tiny elsewhere:
    # at density 0.2 the trim keeps only large entries, so the tiny blocks cannot contribute.
    base = factory.make_base(tmp_path / "base", dtype="F32")
    weights = factory.load(base)
    g = torch.Generator().manual_seed(5)
    for name in ("x0", "x1"):
        out = {}
        for n, t in weights.items():
            d = torch.randn(t.shape, generator=g) * 1e-4
            d[:8] *= 100
            out[n] = t + d
        factory.save_checkpoint(tmp_path / name, out, "F32")
    ingest_model(catalog, base, "base", block_bytes=BLOCK)
    for name in ("x0", "x1"):
        ingest_model(catalog, tmp_path / name, name, base="base", block_bytes=BLOCK)
    p = plan(catalog, "ties", density=0.2, experts="x0,x1")
    rows = [r for m in ("x0", "x1") for r in blocks_of(catalog, m, 0.2)]
    kept = [r for r in rows if r.l2 > 0 and r.max_abs >= r.tau]
    assert 0 < len(kept) < len(rows)
    assert p.full_read_bytes == sum(r.nbytes for r in kept)
    assert {(b.model, b.tensor, b.block_index) for b in p.blocks} == {
        (r.model, r.tensor, r.block_index) for r in kept}
    assert p.full_read_bytes < plan(catalog, "linear", experts="x0,x1").full_read_bytes
    assert len(p.trims) == 2 * len(factory.TINY_SHAPES)
    tr = p.trims[("x1", "model.embed_tokens.weight")]
    assert tr.k == int(0.2 * 64 * 32) and tr.above < tr.k <= tr.above + tr.tied


def test_lora_adapter_reads_lora_a_once_per_tensor(catalog: Catalog,
                                                  family: dict[str, Path]) -> None:
    ingest_model(catalog, family["base"], "base", block_bytes=BLOCK)
    lora = factory.make_lora(family["base"], family["base"].parent / "lora", seed=7)
    ingest_model(catalog, lora, "lo", base="base", kind="lora", block_bytes=BLOCK)
    p = plan(catalog, "task_arithmetic", experts="lo")
    tensors = catalog.query(SQL(
        "SELECT tensor, lora_a_nbytes, nbytes FROM tensors WHERE model = 'lo'"))
    assert len(tensors) == 4  # q_proj and v_proj of two layers
    assert p.planned_expert_bytes == sum(t.lora_a_nbytes + t.nbytes for t in tensors)
    one = plan(catalog, "task_arithmetic", f"{p.blocks[0].nbytes + tensors[0].lora_a_nbytes}B",
               experts="lo")
    assert one.planned_expert_bytes <= one.budget_bytes


def test_expert_without_statistics_falls_back(catalog: Catalog, family: dict[str, Path]) -> None:
    ingest_model(catalog, family["base"], "base", block_bytes=BLOCK)
    ingest_model(catalog, family["e0"], "e0", base="base", block_bytes=BLOCK)
    ingest_model(catalog, family["e1"], "e1", base="base", block_bytes=BLOCK, with_stats=False)
    p = plan(catalog, "linear", 0.6, experts="e0,e1")
    assert p.fallback_experts == ["e1"] and p.omission_bound is None
    fb = [b for b in p.blocks if b.model == "e1"]
    assert fb and all(b.rank > max(x.rank for x in p.blocks if x.model == "e0") for b in fb)
    n_blocks = {r.tensor: r.n_blocks for r in catalog.query(SQL(
        "SELECT tensor, n_blocks FROM tensors WHERE model = 'e1'"))}
    for tensor, idx in p.selected().items():  # whole tensors only
        if tensor[0] == "e1":
            assert idx == set(range(n_blocks[tensor[1]]))


def _family_copy(family: dict[str, Path], dest: Path) -> dict[str, Path]:
    return {k: Path(shutil.copytree(v, dest / k)) for k, v in family.items()}


def test_plan_hash_is_stable_and_tracks_content(tmp_path: Path, family: dict[str, Path]) -> None:
    def hash_of(fam: dict[str, Path], where: str) -> str:
        with Catalog(new_catalog(tmp_path, where)) as cat:
            ingest_family(cat, fam)
            return plan(cat, "ties", 0.4, density=0.5).plan_hash

    first = hash_of(family, "a")
    # Same checkpoints at other paths, in another catalog: the same hash.
    assert hash_of(_family_copy(family, tmp_path / "copy"), "b") == first
    # e1 re-made with another delta: a different hash.
    changed = _family_copy(family, tmp_path / "changed")
    shutil.rmtree(changed["e1"])
    factory.make_expert(changed["base"], changed["e1"], seed=999)
    assert hash_of(changed, "c") != first
