"""lora_A content hashes: ingestion stores xxh3-128 of each LoRA tensor's lora_A bytes
(tensors.lora_a_hash); the executor checks them when it reads lora_A, so an adapter whose lora_A
bytes changed after ingestion (same size, mtime put back) fails the merge with an error that says
to re-ingest, and nothing is published. A catalog row without a hash (ingested before migration
0004) is not checked; the plan hash covers the lora_A hashes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.errors import SourceChanged
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.jobs.merge import merge
from mergepipe.planner.plan import make_plan
from tests import factory
from tests.ingest_reference import rows


def _family(catalog: Catalog, tmp_path: Path, *, with_stats: bool = True) -> Path:
    base = factory.make_base(tmp_path / "base", seed=3, dtype="F32")
    lora = factory.make_lora(base, tmp_path / "lora", seed=4, r=4, alpha=8.0)
    ingest_model(catalog, base, "base", block_bytes=512)
    ingest_model(catalog, lora, "lora", base="base", kind="lora", with_stats=with_stats)
    return lora / "adapter_model.safetensors"


def _request() -> MergeRequest:
    return build_request(base="base", experts="lora", operator="task_arithmetic", budget=1.0)


@pytest.mark.parametrize("with_stats", [True, False])
def test_stored_hash_is_xxh3_of_the_lora_a_bytes(catalog: Catalog, tmp_path: Path,
                                                 with_stats: bool) -> None:
    f = _family(catalog, tmp_path, with_stats=with_stats)
    data = f.read_bytes()
    tensors = rows(catalog, "SELECT tensor, lora_a_offset, lora_a_nbytes, lora_a_hash "
                   "FROM tensors WHERE model = 'lora' ORDER BY ordinal")
    assert len(tensors) == 4
    for t in tensors:
        raw = data[t["lora_a_offset"]:t["lora_a_offset"] + t["lora_a_nbytes"]]
        assert t["lora_a_hash"] == xxhash.xxh3_128_hexdigest(raw), t["tensor"]
    assert len({t["lora_a_hash"] for t in tensors}) == 4
    assert {r["lora_a_hash"] for r in rows(
        catalog, "SELECT lora_a_hash FROM tensors WHERE model = 'base'")} == {None}


def _flip_lora_a_keep_mtime(catalog: Catalog, f: Path) -> str:
    """One byte of a lora_A (its lowest mantissa byte: still finite), same size, mtime put
    back; returns the tensor."""
    t = rows(catalog, "SELECT tensor, lora_a_offset FROM tensors WHERE model = 'lora' "
             "ORDER BY ordinal")[0]
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[t["lora_a_offset"]] ^= 0x01
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    return str(t["tensor"])


def test_changed_lora_a_with_same_size_and_mtime_fails_the_merge(catalog: Catalog,
                                                                 tmp_path: Path) -> None:
    f = _family(catalog, tmp_path)
    tensor = _flip_lora_a_keep_mtime(catalog, f)
    out = tmp_path / "out"
    with pytest.raises(SourceChanged) as e:
        merge(catalog, _request(), out, output_name="merged")
    msg = str(e.value)
    assert (f"model 'lora': tensor {tensor!r} lora_A in {f}" in msg
            and "does not match the catalog's content hash" in msg
            and "re-ingest 'lora'" in msg), msg
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == []
    assert rows(catalog, "SELECT name FROM models WHERE name = 'merged'") == []
    row = catalog.query(SQL("SELECT status, error FROM merges"))[0]
    assert row.status == "failed" and "re-ingest 'lora'" in row.error


def test_a_catalog_row_without_a_hash_is_not_checked(catalog: Catalog, tmp_path: Path) -> None:
    """Adapters ingested before migration 0004 have no lora_A hash: merges skip the check (and
    their plan hash is what it was before the migration: the hash is left out)."""
    _family(catalog, tmp_path)
    with_hash = make_plan(catalog, _request()).plan_hash
    with catalog.transaction() as conn:
        conn.execute(SQL("UPDATE tensors SET lora_a_hash = 'stale' WHERE model = 'lora'"))
    assert make_plan(catalog, _request()).plan_hash != with_hash
    with catalog.transaction() as conn:
        conn.execute(SQL("UPDATE tensors SET lora_a_hash = NULL WHERE model = 'lora'"))
    without = make_plan(catalog, _request()).plan_hash
    assert without != with_hash
    r = merge(catalog, _request(), tmp_path / "out", output_name="merged").to_dict()
    assert r["plan_hash"] == without
    assert (tmp_path / "out" / "model.safetensors").exists()
