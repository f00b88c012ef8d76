"""Every byte of an output is verified against the catalog's content hash, kernel copies too: a
base rewritten in place after ingestion (size and mtime kept, as `rsync -a` of another version
leaves it) fails the merge, naming the file and the tensor, and nothing is published."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import find_model
from mergepipe.core.errors import Forbidden, SourceChanged
from mergepipe.core.request import build_request
from mergepipe.executor.writer import CheckpointWriter
from mergepipe.jobs.merge import merge
from mergepipe.planner.plan import make_plan
from mergepipe.storage.checkpoint import open_checkpoint
from mergepipe.storage.fsconfine import confined
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

EXPERTS = "e0,e1:0.5,e2:2"
BUDGET = 0.02


def _untouched(cat: Catalog, one_block: bool) -> str:
    """A base tensor in which the plan reads no expert block, of one block or of several."""
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=BUDGET)
    touched = {b.tensor for b in make_plan(cat, req).blocks}
    rows = cat.query(SQL("SELECT tensor, count(*) FROM blocks WHERE model = 'base' "
                         "GROUP BY tensor ORDER BY tensor"))
    return next(t for t, n in rows if t not in touched and (int(n) == 1) == one_block)


def _rewrite_in_place(path: Path, offset: int, nbytes: int) -> None:
    """Change a tensor's bytes, keeping the file's size and mtime (what a size+mtime check sees)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(nbytes)
        f.seek(offset)
        f.write(bytes(b ^ 0x40 for b in old))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("one_block", [True, False], ids=["kernel-copied", "read"])
def test_a_base_rewritten_in_place_fails_the_merge_and_publishes_nothing(
        tmp_path: Path, one_block: bool) -> None:
    cat = Catalog(new_catalog(tmp_path))
    try:
        paths = ingest_family(cat, tmp_path / "fam", block_bytes=2048)
        tensor = _untouched(cat, one_block)
        entry = open_checkpoint(paths["base"]).by_name()[tensor]
        _rewrite_in_place(Path(entry.file), entry.data_offset, entry.nbytes)
        req = build_request(base="base", experts=EXPERTS, operator="linear", budget=BUDGET)
        with pytest.raises(SourceChanged) as err:
            merge(cat, req, tmp_path / "out", output_name="vout")
        assert repr(tensor) in err.value.message and entry.file in err.value.message
        assert "re-ingest 'base'" in err.value.message
        assert not (tmp_path / "out").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
        assert find_model(cat, "vout") is None
        (status, error), = cat.query(SQL("SELECT status, error FROM merges"))
        assert status == "failed" and repr(tensor) in error
    finally:
        cat.close()


def _one_tensor_file(path: Path, payload: bytes) -> None:
    path.write_bytes(payload)


def test_a_kernel_copy_is_checked_against_the_hash_it_must_have(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    _one_tensor_file(src, bytes(range(16)))
    good = xxhash.xxh3_128_hexdigest(bytes(range(16)))
    w = CheckpointWriter(tmp_path, [("m.safetensors", [("t", "F32", (4,))])])
    with pytest.raises(SourceChanged, match=r"model 'base': tensor 't' in .*src\.bin \(bytes "
                                            r"0\.\.16\) does not match"):
        w.copy_tensor("t", str(src), 0, "0" * 32, "base")
    w.abort()
    (tmp_path / "m.safetensors").unlink()
    w = CheckpointWriter(tmp_path, [("m.safetensors", [("t", "F32", (4,))])])
    w.copy_tensor("t", str(src), 0, good, "base")
    (t,) = w.finish()
    assert t.content_hash == good  # hashed from the bytes read back, equal to the catalog's
    assert (tmp_path / "m.safetensors").read_bytes().endswith(bytes(range(16)))


def test_a_kernel_copy_opens_its_source_beneath_the_data_root(tmp_path: Path) -> None:
    root, outside, out = tmp_path / "root", tmp_path / "outside", tmp_path / "out"
    for d in (root, outside, out):
        d.mkdir()
    _one_tensor_file(outside / "secret.bin", bytes(range(16)))
    (root / "base.bin").symlink_to(outside / "secret.bin")  # swapped in after acceptance
    with confined([root]):
        w = CheckpointWriter(out, [("m.safetensors", [("t", "F32", (4,))])])
    try:
        with pytest.raises(Forbidden, match="outside the data root"):
            w.copy_tensor("t", str(root / "base.bin"), 0,
                          xxhash.xxh3_128_hexdigest(bytes(range(16))), "base")
    finally:
        w.abort()
