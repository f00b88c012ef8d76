"""Ingestion of bases, full experts and delta checkpoints: rows, grid, hashes, exact statistics."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import xxhash

from mergepipe.catalog import scan, stats
from mergepipe.catalog.ingest import ingest_model, scan_model
from mergepipe.catalog.models import ModelRow, get_model, list_models
from mergepipe.storage import storage
from mergepipe.storage.grid import block_rows
from tests import factory
from tests.ingest_reference import (
    check_block_stats,
    check_tensor_stats,
    full_deltas,
    rows,
)

SMALL = 256  # bytes per block: every 2-D tensor of the tiny family spans several blocks


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return 8 + n, json.loads(raw[8:8 + n])


def test_base_rows_describe_the_files(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=0, dtype="BF16")
    m = ingest_model(catalog, base, "base", block_bytes=SMALL)
    assert m.kind == "full" and m.base is None and m.status == "ready"
    assert m.has_stats is False and m.block_bytes == SMALL
    assert m.n_tensors == len(factory.TINY_SHAPES) and m.path == str(base)
    f = base / "model.safetensors"
    header_len, header = _header(f)
    (frow,) = rows(catalog, "SELECT * FROM files WHERE model = 'base'")
    assert frow["path"] == str(f) and frow["size"] == f.stat().st_size
    assert frow["mtime_ns"] == f.stat().st_mtime_ns and frow["header_len"] == header_len
    assert m.tensor_bytes == f.stat().st_size - header_len

    tensors = rows(catalog, "SELECT * FROM tensors WHERE model = 'base' ORDER BY ordinal")
    by_offset = sorted((k for k in header if k != "__metadata__"),
                       key=lambda k: header[k]["data_offsets"][0])
    assert [t["tensor"] for t in tensors] == by_offset  # checkpoint order
    data = f.read_bytes()
    for t in tensors:
        h = header[t["tensor"]]
        assert t["shape"] == h["shape"] and t["dtype"] == "BF16"
        assert t["data_offset"] == header_len + h["data_offsets"][0]
        assert t["nbytes"] == h["data_offsets"][1] - h["data_offsets"][0]
        blocks = rows(catalog, "SELECT * FROM blocks WHERE model = 'base' AND tensor = :t "
                      "ORDER BY block_index", t=t["tensor"])
        grid = block_rows(tuple(h["shape"]), 2, SMALL)
        assert [(b["row_start"], b["row_end"]) for b in blocks] == grid
        assert t["n_blocks"] == len(grid)
        pos = t["data_offset"]
        for b in blocks:  # contiguous byte ranges covering the tensor, hashed independently
            assert b["byte_offset"] == pos and b["file_index"] == 0
            assert b["content_hash"] == xxhash.xxh3_128_hexdigest(data[pos:pos + b["nbytes"]])
            pos += b["nbytes"]
        assert pos == t["data_offset"] + t["nbytes"]
    assert not rows(catalog, "SELECT * FROM block_stats WHERE model = 'base'")
    assert not rows(catalog, "SELECT * FROM tensor_stats WHERE model = 'base'")


@pytest.mark.parametrize("base_dtype,expert_dtype", [
    ("BF16", "BF16"), ("F16", "F16"), ("F32", "F32"), ("BF16", "F32"), ("F32", "BF16")])
def test_full_expert_statistics_are_exact(tmp_path: Path, catalog, base_dtype: str,
                                          expert_dtype: str) -> None:
    base = factory.make_base(tmp_path / "base", seed=1, dtype=base_dtype)
    expert = factory.make_expert(base, tmp_path / "e", seed=2, dtype=expert_dtype,
                                 zero_tensors=("model.norm.weight",), sparsity=0.3)
    ingest_model(catalog, base, "base", block_bytes=SMALL)
    m = ingest_model(catalog, expert, "e", base="base")
    assert m.has_stats is True and m.base == "base" and m.block_bytes == SMALL
    deltas = full_deltas(base, expert)
    n = check_block_stats(catalog, "e", deltas)
    assert n > len(deltas)  # multi-block grid
    check_tensor_stats(catalog, "e", deltas)
    # The expert shares the base's grid; its byte ranges are its own (dtype may differ).
    grid = rows(catalog, """SELECT e.tensor, e.byte_offset, e.nbytes, b.nbytes AS base_nbytes
                            FROM blocks e JOIN blocks b USING (tensor, block_index, row_start,
                            row_end) WHERE e.model = 'e' AND b.model = 'base'""")
    assert len(grid) == n
    ratio = factory.TORCH[expert_dtype].itemsize / factory.TORCH[base_dtype].itemsize
    assert all(g["nbytes"] == g["base_nbytes"] * ratio for g in grid)
    if base_dtype == expert_dtype:  # an untouched tensor: zero delta, every entry tied at 0
        zero = rows(catalog, "SELECT * FROM tensor_stats WHERE model = 'e' AND tensor = "
                    "'model.norm.weight'")[0]
        assert zero["l2"] == 0 and zero["nnz"] == 0
        n = zero["numel"]
        assert n > 0 and zero["trim_tau"] == [0.0] * 100  # k >= 1 (mergekit's floor)
        assert zero["trim_tied"][-1] == n and zero["trim_above"][-1] == 0


def test_sharded_expert_on_single_file_base(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=3, shards=1)
    expert = factory.make_expert(base, tmp_path / "e", seed=4, shards=3)
    ingest_model(catalog, base, "base", block_bytes=512)
    ingest_model(catalog, expert, "e", base="base")
    files = rows(catalog, "SELECT * FROM files WHERE model = 'e' ORDER BY file_index")
    assert [Path(f["path"]).name for f in files] == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((expert / "model.safetensors.index.json").read_text())["weight_map"]
    for t in rows(catalog, "SELECT tensor, file_index FROM tensors WHERE model = 'e'"):
        assert Path(files[t["file_index"]]["path"]).name == index[t["tensor"]]
    for b in rows(catalog, "SELECT * FROM blocks WHERE model = 'e'"):
        with open(files[b["file_index"]]["path"], "rb") as fh:
            fh.seek(b["byte_offset"])
            assert xxhash.xxh3_128_hexdigest(fh.read(b["nbytes"])) == b["content_hash"]
    deltas = full_deltas(base, expert)
    check_block_stats(catalog, "e", deltas)
    check_tensor_stats(catalog, "e", deltas)


def test_sharded_base(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=5, shards=2, dtype="F16")
    expert = factory.make_expert(base, tmp_path / "e", seed=6)
    m = ingest_model(catalog, base, "base", block_bytes=SMALL)
    assert len(rows(catalog, "SELECT * FROM files WHERE model = 'base'")) == 2
    assert m.n_tensors == len(factory.TINY_SHAPES)
    ingest_model(catalog, expert, "e", base="base")
    check_tensor_stats(catalog, "e", full_deltas(base, expert))


def test_delta_checkpoint(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=7)
    delta = factory.make_delta(base, tmp_path / "d", seed=8, dtype="F32")
    ingest_model(catalog, base, "base", block_bytes=SMALL)
    m = ingest_model(catalog, delta, "d", base="base", kind="delta")
    assert m.kind == "delta" and m.has_stats
    deltas = factory.load(delta)  # the tensors are the deltas themselves
    check_block_stats(catalog, "d", deltas)
    check_tensor_stats(catalog, "d", deltas)
    # f32 delta on a bf16 base: the grid's rows are the base's, the bytes twice as many.
    r = rows(catalog, """SELECT d.nbytes, b.nbytes AS bn FROM blocks d JOIN blocks b
                         USING (tensor, block_index) WHERE d.model = 'd' AND b.model = 'base'""")
    assert all(x["nbytes"] == 2 * x["bn"] for x in r)


def test_single_file_path_and_odd_shapes(tmp_path: Path, catalog) -> None:
    """A bare .safetensors file; 0-D, 1-D, empty and 3-D tensors."""
    shapes = {"scalar": (), "vec": (300,), "empty": (0, 4), "cube": (10, 6, 5),
              "tall": (257, 3)}
    base = factory.make_base(tmp_path / "base", seed=9, dtype="F32", shapes=shapes)
    expert = factory.make_expert(base, tmp_path / "e", seed=10)
    ingest_model(catalog, base / "model.safetensors", "base", block_bytes=128)
    m = ingest_model(catalog, expert / "model.safetensors", "e", base="base")
    assert m.path == str(expert / "model.safetensors")
    deltas = full_deltas(base, expert)
    got = {r["tensor"]: r for r in rows(catalog, "SELECT * FROM tensors WHERE model = 'e'")}
    assert got["scalar"]["shape"] == [] and got["scalar"]["n_blocks"] == 1
    assert got["cube"]["n_blocks"] == len(block_rows((10, 6, 5), 4, 128)) > 1
    assert deltas["empty"].shape == (0, 4)
    check_block_stats(catalog, "e", deltas)
    check_tensor_stats(catalog, "e", deltas)


def test_no_stats_registers_blocks_without_reading_the_base(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=11)
    expert = factory.make_expert(base, tmp_path / "e", seed=12)
    ingest_model(catalog, base, "base", block_bytes=SMALL)
    scanned = scan_model(catalog, expert, "e", base="base", with_stats=False)
    m = get_model_after_write(catalog, scanned)
    assert m.has_stats is False
    assert scanned.bytes_read == m.tensor_bytes  # only the expert's own bytes
    assert not rows(catalog, "SELECT * FROM block_stats WHERE model = 'e'")
    assert not rows(catalog, "SELECT * FROM tensor_stats WHERE model = 'e'")
    same = rows(catalog, """SELECT count(*) AS n FROM blocks e JOIN blocks b
                            USING (tensor, block_index, row_start, row_end, nbytes)
                            WHERE e.model = 'e' AND b.model = 'base'""")[0]["n"]
    assert same == len(rows(catalog, "SELECT * FROM blocks WHERE model = 'base'"))


def get_model_after_write(catalog, scanned) -> ModelRow:
    from mergepipe.catalog.ingest import write_model
    with catalog.transaction() as conn:
        write_model(conn, scanned)
    return get_model(catalog, scanned.name)


def test_progress_reports_bytes_up_to_the_total(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=13)
    expert = factory.make_expert(base, tmp_path / "e", seed=14)
    ingest_model(catalog, base, "base", block_bytes=SMALL)
    seen: list[tuple[int, int]] = []
    m = ingest_model(catalog, expert, "e", base="base", progress=lambda p: seen.append((p.done, p.total)))
    assert seen and all(t == m.tensor_bytes for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == m.tensor_bytes


def test_worker_threads_give_the_same_rows(tmp_path: Path, catalog, monkeypatch) -> None:
    """The threaded pipeline (big scans) and the inline one (small scans) agree exactly."""
    base = factory.make_base(tmp_path / "base", seed=15, dtype="F32")
    expert = factory.make_expert(base, tmp_path / "e", seed=16, dtype="F32")
    ingest_model(catalog, base, "base", block_bytes=SMALL)
    inline = scan_model(catalog, expert, "e", base="base")
    monkeypatch.setattr(scan, "INLINE_BELOW", 0)
    threaded = scan_model(catalog, expert, "e", base="base")
    for table in ("files", "tensors", "blocks", "block_stats", "tensor_stats"):
        assert getattr(inline, table) == getattr(threaded, table), table


def test_expert_of_expert_output_and_source_merge(tmp_path: Path, catalog) -> None:
    base = factory.make_base(tmp_path / "base", seed=17)
    out = factory.make_expert(base, tmp_path / "merged", seed=18)
    ingest_model(catalog, base, "base")
    m = ingest_model(catalog, out, "merged", base="base", source_merge="m-123")
    assert m.source_merge == "m-123" and m.block_bytes == 1 << 20


def test_list_models_orders_bases_then_experts(tmp_path: Path, catalog) -> None:
    b1 = factory.make_base(tmp_path / "b1", seed=19)
    b2 = factory.make_base(tmp_path / "b2", seed=20)
    ingest_model(catalog, b2, "zeta")
    ingest_model(catalog, b1, "alpha")
    ingest_model(catalog, factory.make_expert(b2, tmp_path / "x", seed=21), "x2", base="zeta",
                 with_stats=False)
    ingest_model(catalog, factory.make_expert(b1, tmp_path / "y", seed=22), "y1", base="alpha",
                 with_stats=False)
    assert [m.name for m in list_models(catalog)] == ["alpha", "y1", "zeta", "x2"]
    assert isinstance(get_model(catalog, "y1").created_at, str)


def test_scan_reads_files_by_range_never_whole(tmp_path: Path, catalog, monkeypatch) -> None:
    """Reads go through LocalFileReader in block-sized ranges (one block per read); the only
    others are the safetensors headers (the length prefix, then the header itself)."""
    base = factory.make_base(tmp_path / "base", seed=23, dtype="F32")
    expert = factory.make_expert(base, tmp_path / "e", seed=24)
    ingest_model(catalog, base, "base", block_bytes=SMALL)
    reads: list[tuple[str, int, int]] = []
    real = storage.LocalFileReader.read_into

    def spy(self, path: str, offset: int, out: memoryview) -> None:
        reads.append((path, offset, len(out)))
        real(self, path, offset, out)

    monkeypatch.setattr(storage.LocalFileReader, "read_into", spy)
    ingest_model(catalog, expert, "e", base="base")
    headers = {}
    for f in (base / "model.safetensors", expert / "model.safetensors"):
        data_start, _ = _header(f)
        headers[str(f)] = data_start
    sizes = []
    for path, offset, n in reads:
        if offset < headers[path]:  # the header: its 8-byte length, then its JSON
            assert (offset, n) in ((0, 8), (8, headers[path] - 8)), (path, offset, n)
        else:
            sizes.append(n)
    assert sizes and max(sizes) <= SMALL
    assert os.path.getsize(expert / "model.safetensors") > 10 * SMALL


@pytest.mark.parametrize("keep_mixed", [True, False])
def test_blocks_equal_to_the_base_are_not_computed(tmp_path: Path, catalog, monkeypatch,
                                                   keep_mixed: bool) -> None:
    """Untouched blocks (same bytes as the base) count as zeros, also when the threshold bin of
    zero needs refining: here 3 of 4 blocks are untouched and the rest are zeros and denormals."""
    import torch
    if not keep_mixed:
        monkeypatch.setattr(stats, "MIXED_CAP", 0)
    g = torch.Generator().manual_seed(5)
    w = torch.zeros(64, 64)
    w[:48] = torch.randn(48, 64, generator=g)
    e = w.clone()
    tail = torch.randint(0, 3, (16, 64), generator=g).float() * 1e-45  # denormals and zeros
    e[48:] = tail
    e[60, 0] = 0.5  # one large entry
    base = factory.save_checkpoint(tmp_path / "base", {"w": w, "v": w[:8].clone()}, "F32")
    expert = factory.save_checkpoint(tmp_path / "e", {"w": e, "v": w[:8].clone()}, "F32")
    ingest_model(catalog, base, "base", block_bytes=64 * 64)  # 16 rows per block
    reads: list[tuple[str, int]] = []
    real = storage.LocalFileReader.read_into

    def spy(self, path: str, offset: int, out: memoryview) -> None:
        reads.append((path, offset))
        real(self, path, offset, out)

    monkeypatch.setattr(storage.LocalFileReader, "read_into", spy)
    ingest_model(catalog, expert, "e", base="base")
    deltas = full_deltas(base, expert)
    check_block_stats(catalog, "e", deltas)
    check_tensor_stats(catalog, "e", deltas)
    base_file = str(base / "model.safetensors")
    changed = rows(catalog, "SELECT byte_offset FROM blocks WHERE model = 'base' AND tensor = 'w' "
                   "AND block_index = 3")[0]["byte_offset"]
    base_reads = [o for p, o in reads if p == base_file]
    assert base_reads and set(base_reads) == {changed}  # untouched blocks: the base is not read
    assert len(base_reads) == (1 if keep_mixed else 3)  # pass 1 (+ two refinement levels)
