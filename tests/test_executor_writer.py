"""The safetensors writer, side-file copy and atomic publish, in isolation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mergepipe.core.errors import BudgetViolation, Conflict
from mergepipe.executor import publish
from mergepipe.executor.schedule import BudgetCounter, Range, coalesce
from mergepipe.executor.side_files import copy_side_files
from mergepipe.executor.writer import CheckpointWriter, encode


def _write(out: Path, tensors: dict[str, torch.Tensor], dtype: str, *, shards: int = 1,
           rows_per_write: int = 3) -> list:
    names = list(tensors)
    files = []
    for s in range(shards):
        part = names[s::shards]
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        files.append((fname, [(n, dtype, tuple(tensors[n].shape)) for n in part]))
    w = CheckpointWriter(out, files, metadata={files[0][0]: {"format": "pt"}},
                         write_index=shards > 1)
    for n, t in tensors.items():
        rows = t.shape[0] if t.ndim else 1
        row_numel = t.numel() // rows if rows else 0
        for r in range(0, rows, rows_per_write):
            w.write(n, r * row_numel, encode(t[r:r + rows_per_write] if t.ndim else t, dtype))
    return w.finish()


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_writer_round_trips_through_safetensors(tmp_path: Path, dtype: str) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"b.weight": torch.randn(10, 4, generator=g), "a.bias": torch.randn(7, generator=g),
               "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3)}
    out = _write(tmp_path, tensors, dtype)
    loaded = load_file(str(tmp_path / "model.safetensors"))
    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
    for n, t in tensors.items():
        assert loaded[n].dtype == torch_dtype
        assert torch.equal(loaded[n], t.to(torch_dtype)), n
    assert [t.name for t in out] == list(tensors)  # the order we were given
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_writer_hashes_are_xxh3_of_the_written_bytes(tmp_path: Path) -> None:
    import xxhash
    t = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    (out,) = _write(tmp_path, {"t": t}, "F32", rows_per_write=2)
    assert out.content_hash == xxhash.xxh3_128_hexdigest(t.numpy().tobytes())


def test_sharded_output_has_an_index(tmp_path: Path) -> None:
    tensors = {f"t{i}": torch.full((2, 2), float(i)) for i in range(5)}
    _write(tmp_path, tensors, "BF16", shards=2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 4 * 2
    assert index["weight_map"] == {"t0": "model-00001-of-00002.safetensors",
                                   "t1": "model-00002-of-00002.safetensors",
                                   "t2": "model-00001-of-00002.safetensors",
                                   "t3": "model-00002-of-00002.safetensors",
                                   "t4": "model-00001-of-00002.safetensors"}
    for shard in set(index["weight_map"].values()):
        for n, t in load_file(str(tmp_path / shard)).items():
            assert index["weight_map"][n] == shard
            assert torch.equal(t.float(), tensors[n])


def test_writer_refuses_out_of_order_and_missing_rows(tmp_path: Path) -> None:
    w = CheckpointWriter(tmp_path, [("m.safetensors", [("t", "F32", (4, 2))])])
    with pytest.raises(RuntimeError, match="out of order"):
        w.write("t", 4, encode(torch.zeros(2, 2), "F32"))
    w.write("t", 0, encode(torch.zeros(2, 2), "F32"))
    with pytest.raises(RuntimeError, match="only 4 of 8 elements"):
        w.finish()
    w.abort()


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_writer_refuses_inf_and_nan_past_its_first_chunk(tmp_path: Path, dtype: str) -> None:
    """A piece of 2^18 + 3 entries (the check runs 2^18 at a time): the finite one is written,
    an Inf or NaN in the last entry refused, naming the tensor and the dtype."""
    import math

    from mergepipe.core.errors import InvalidRequest

    n = (1 << 18) + 3
    w = CheckpointWriter(tmp_path, [("m.safetensors", [("t", dtype, (4, n))])])
    w.write("t", 0, encode(torch.randn(n) * 1e3, dtype))
    for bad in (math.inf, -math.inf, math.nan):
        x = torch.randn(n)
        x[-1] = bad
        with pytest.raises(InvalidRequest, match="'t': the merged values include Inf or NaN"):
            w.write("t", n, encode(x, dtype))
    w.abort()


def test_extra_files_copied_and_config_dtype_updated(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "hidden_size": 8}))
    (src / "tokenizer.json").write_text('{"model": {}}')
    (src / "pytorch_model.bin").write_bytes(b"stale weights")
    out = tmp_path / "out"
    out.mkdir()
    side = copy_side_files([str(p) for p in sorted(src.iterdir())], out, "F32")
    assert sorted(side.copied) == ["config.json", "tokenizer.json"]
    assert [f["name"] for f in side.left_out] == ["pytorch_model.bin"]
    assert json.loads((out / "config.json").read_text()) == {"torch_dtype": "float32",
                                                             "hidden_size": 8}
    assert (out / "tokenizer.json").read_text() == '{"model": {}}'
    assert not (out / "pytorch_model.bin").exists()


def test_publish_is_all_or_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"), publish.staged(target, "abc") as stage:
        (stage / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("boom")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary directory left behind
    with publish.staged(target, "abc") as stage:
        assert stage.parent == tmp_path and stage.name.startswith(".out.tmp-")
        (stage / "manifest.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (target / "manifest.json").read_text() == "{}"


def test_publish_refuses_a_non_empty_target_unless_allowed(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    publish.check_target(target)  # an empty directory is fine
    (target / "x").write_text("keep me")
    with pytest.raises(Conflict, match="not empty"), publish.staged(target, "t1"):
        pass
    assert (target / "x").read_text() == "keep me"
    with publish.staged(target, "t2", overwrite=True) as stage:
        (stage / "y").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_coalesce_merges_adjacent_ranges_of_one_file() -> None:
    rs = [Range("c", "/f", 200, 50, True), Range("a", "/f", 100, 50, True),
          Range("b", "/f", 150, 50, True), Range("d", "/g", 250, 10, True),
          Range("e", "/f", 300, 10, True)]
    units = coalesce(rs)
    assert [(u.path, u.offset, u.nbytes, [p.key for p in u.pieces]) for u in units] == [
        ("/f", 100, 150, ["a", "b", "c"]), ("/f", 300, 10, ["e"]), ("/g", 250, 10, ["d"])]
    assert len(coalesce(rs, max_bytes=100)) == 4


def test_budget_counter_refuses_to_pass_the_budget() -> None:
    b = BudgetCounter(100)
    b.reserve(60, "x")
    b.reserve(40, "y")
    with pytest.raises(BudgetViolation, match="over the budget of 100"):
        b.reserve(1, "z")


def test_writeback_starts_while_writing_and_changes_no_byte(tmp_path: Path) -> None:
    """The writer starts the kernel's write-back every `every` bytes (sync_file_range on
    Linux); the file is the same as written without it."""
    import sys

    from mergepipe.executor import writer as writeback

    g = torch.Generator().manual_seed(1)
    tensors = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = _write(tmp_path / "a", tensors, "F32")
    layout = [(n, "F32", tuple(t.shape)) for n, t in tensors.items()]
    w = CheckpointWriter(tmp_path / "b", [("model.safetensors", layout)],
                         metadata={"model.safetensors": {"format": "pt"}})
    w.writeback = writeback.Writeback(every=1024)
    for n, t in tensors.items():
        rows = t.shape[0]
        for r in range(0, rows, 8):
            w.write(n, r * (t.numel() // rows), encode(t[r:r + 8], "F32"))
    again = w.finish()
    assert [x.content_hash for x in again] == [x.content_hash for x in plain]
    assert ((tmp_path / "a" / "model.safetensors").read_bytes()
            == (tmp_path / "b" / "model.safetensors").read_bytes())
    if sys.platform.startswith("linux"):
        assert w.writeback.started >= (64 * 32 * 4) // 1024 - 1
