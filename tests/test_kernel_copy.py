"""Untouched one-block tensors are copied from the base by the kernel (and read back to verify
them): same bytes, same hashes, same registered statistics, with or without os.copy_file_range."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.request import build_request
from mergepipe.executor import writer
from mergepipe.executor.prepare import prepare
from mergepipe.executor.stream import ExecutionResult, execute
from mergepipe.jobs.merge import merge
from mergepipe.planner.plan import make_plan
from mergepipe.storage.checkpoint import open_checkpoint
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

EXPERTS = "e0,e1:0.5,e2:2"


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("kcopy")
    cat = Catalog(new_catalog(root))
    paths = ingest_family(cat, root / "fam", block_bytes=2048)  # some one-block tensors
    yield {"cat": cat, "paths": paths}
    cat.close()


def _execute(cat: Catalog, out: Path, op: str, budget: float, **params: float
             ) -> ExecutionResult:
    req = build_request(base="base", experts=EXPERTS, operator=op, budget=budget, params=params)
    out.mkdir()
    return execute(prepare(cat, make_plan(cat, req)), out, first_pass=True)


def _never_read(cat: Catalog, op: str, budget: float, **params: float) -> int:
    """Bytes of the base's one-block tensors in which the plan reads no expert block."""
    req = build_request(base="base", experts=EXPERTS, operator=op, budget=budget, params=params)
    touched = {b.tensor for b in make_plan(cat, req).blocks}
    rows = cat.query(SQL("SELECT tensor, sum(nbytes) FROM blocks WHERE model = 'base' "
                             "GROUP BY tensor HAVING count(*) = 1"))
    return sum(int(n) for t, n in rows if t not in touched)


def _file_hashes(out: Path) -> dict[str, str]:
    """xxh3-128 of each tensor's bytes as written."""
    ckpt = open_checkpoint(out)
    hashes = {}
    for t in ckpt.tensors:
        with open(t.file, "rb") as f:
            f.seek(t.data_offset)
            hashes[t.name] = xxhash.xxh3_128_hexdigest(f.read(t.nbytes))
    return hashes


@pytest.mark.parametrize("op,params", [("linear", {}), ("ties", {"density": 0.5})])
def test_kernel_copy_gives_the_same_bytes_and_hashes_as_user_space(
        fam: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str, params: dict
        ) -> None:
    cat = fam["cat"]
    fast = _execute(cat, tmp_path / "fast", op, 0.02, **params)
    assert 0 < fast.kernel_copied_bytes < sum(
        os.path.getsize(p) for p in (tmp_path / "fast").glob("*.safetensors"))
    # One-block tensors no expert touches are not read at all.
    out_bytes = sum(t.nbytes for t in open_checkpoint(tmp_path / "fast").tensors)
    assert fast.base_bytes_read == out_bytes - _never_read(cat, op, 0.02, **params) < out_bytes

    def unsupported(*args: object) -> int:
        raise OSError(errno.ENOSYS, "copy_file_range not supported")

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    slow = _execute(cat, tmp_path / "slow", op, 0.02, **params)
    assert slow.kernel_copied_bytes == 0
    for name in ("model.safetensors",):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "slow" / name).read_bytes()
    assert fast.output_hash == slow.output_hash
    assert {t.name: t.content_hash for t in fast.tensors} == _file_hashes(tmp_path / "fast")
    monkeypatch.delattr(os, "copy_file_range")  # a platform without it
    none = _execute(cat, tmp_path / "none", op, 0.02, **params)
    assert none.output_hash == fast.output_hash and none.kernel_copied_bytes == 0


def test_registered_output_statistics_match_a_fresh_ingestion(fam: dict,
                                                              tmp_path: Path) -> None:
    cat = fam["cat"]
    req = build_request(base="base", experts=EXPERTS, operator="ties", budget=0.02,
                        params={"density": 0.5})
    merge(cat, req, tmp_path / "m", output_name="kc")
    ingest_model(cat, tmp_path / "m", "kc-again", base="base")
    for table, cols in (("block_stats", "tensor, block_index, l2, l1, max_abs, nnz"),
                        ("tensor_stats", "tensor, numel, l2, l1, max_abs, nnz, trim_tau, "
                                         "trim_above, trim_tied"),
                        ("blocks", "tensor, block_index, nbytes, content_hash")):
        q = f"SELECT {cols} FROM {table} WHERE model = :m ORDER BY 1, 2"
        a = [tuple(r) for r in cat.query(SQL(q), {"m": "kc"})]
        b = [tuple(r) for r in cat.query(SQL(q), {"m": "kc-again"})]
        assert a == b, table


def test_a_copy_is_a_whole_tensor(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(16)))
    w = writer.CheckpointWriter(tmp_path, [("m.safetensors", [("t", "F32", (4,))])])
    w.write("t", 0, bytes(4))
    with pytest.raises(RuntimeError, match="whole tensor"):
        w.copy_tensor("t", str(src), 0, xxhash.xxh3_128_hexdigest(bytes(range(16))), "base")
    w.abort()
