"""Our safetensors header parser and float conversions agree with the safetensors library."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest
from mergepipe.core.vocab import normalize_dtype
from mergepipe.storage.checkpoint import open_checkpoint
from mergepipe.storage.safetensors_format import (
    decode_array_into,
    encode_header,
    from_float32,
    read_header,
    to_float32,
    torch_dtype,
)
from tests import factory

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _write(path: Path, header: object, data: bytes = b"", raw_header: bytes | None = None) -> Path:
    js = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(js)) + js + data)
    return path


def test_header_matches_the_library(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16),
               "c": torch.randn(2, 2, 2).half(), "s": torch.tensor(1.5), "e": torch.zeros(0, 3)}
    f = tmp_path / "m.safetensors"
    save_file(tensors, str(f), metadata={"format": "pt"})
    h = read_header(f)
    assert h.metadata == {"format": "pt"} and h.size == f.stat().st_size
    data = f.read_bytes()
    by_name = {t.name: t for t in h.tensors}
    assert set(by_name) == set(tensors)
    for name, t in tensors.items():
        e = by_name[name]
        assert e.shape == tuple(t.shape) and e.file == str(f)
        raw = data[e.data_offset:e.data_offset + e.nbytes]
        got = to_float32(raw, e.dtype, e.shape)
        assert torch.equal(got, t.float())
    offsets = [e.data_offset for e in h.tensors]
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_float_round_trip_bit_exact(dtype: str) -> None:
    x = torch.randn(1000) * 100
    x[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-30])
    ref = x.to(TORCH[dtype])
    raw = from_float32(x, dtype)
    assert raw == ref.view(torch.uint8).numpy().tobytes()
    back = to_float32(raw, dtype)
    assert torch.equal(back.view(torch.int32), ref.float().view(torch.int32))
    # the scan's numpy decode (no torch): the same bits, special values included
    assert np.array_equal(decode_array_into(raw, dtype, np.empty(1000, np.float32)).view(np.int32),
                          back.view(torch.int32).numpy())
    assert torch_dtype(dtype) == TORCH[dtype]
    assert to_float32(bytearray(raw), dtype, (10, 100)).shape == (10, 100)
    assert to_float32(b"", dtype, (0, 4)).shape == (0, 4)


def test_to_float32_returns_a_writable_copy() -> None:
    raw = bytearray(from_float32(torch.ones(4), "F32"))
    t = to_float32(raw, "F32")
    t += 1
    assert torch.equal(to_float32(raw, "F32"), torch.ones(4))


def test_encode_header_is_readable_by_the_library(tmp_path: Path) -> None:
    entries = [("w", "BF16", (4, 3)), ("b", "F32", (3,)), ("h", "F16", (2, 2))]
    head, spans = encode_header(entries, {"format": "pt"})
    assert len(head) % 8 == 0
    values = {"w": torch.randn(4, 3), "b": torch.randn(3), "h": torch.randn(2, 2)}
    data = b"".join(from_float32(values[n], d) for n, d, _ in entries)
    assert spans[-1][1] == len(data)
    f = tmp_path / "x.safetensors"
    f.write_bytes(head + data)
    loaded = load_file(str(f))
    for n, d, _ in entries:
        assert torch.equal(loaded[n], values[n].to(TORCH[d]))
    assert read_header(f).header_len == len(head)


@pytest.mark.parametrize("header,data,needle", [
    ({"w": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, "'I8' unsupported"),
    ({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}}, b"\0" * 8, "invalid shape"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, "invalid data_offsets"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, "out of order"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "truncated"),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "8 bytes for shape"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "overlaps"),
    ({"w": [1, 2]}, b"", "not an object"),
    ([1, 2], b"", "not a JSON object"),
    ({"__metadata__": [1]}, b"", "__metadata__"),
])
def test_bad_headers_name_file_and_tensor(tmp_path: Path, header, data: bytes,
                                          needle: str) -> None:
    f = _write(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(InvalidCheckpoint, match=needle) as info:
        read_header(f)
    assert str(f) in info.value.message


def test_short_and_oversized_headers(tmp_path: Path) -> None:
    f = tmp_path / "short.safetensors"
    f.write_bytes(b"\1\2\3")
    with pytest.raises(InvalidCheckpoint, match="too short"):
        read_header(f)
    f.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(InvalidCheckpoint, match="larger than the file"):
        read_header(f)
    f.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(InvalidCheckpoint, match="exceeds"):
        read_header(f)
    _write(f, None, raw_header=b"\xff\xfe{}")
    with pytest.raises(InvalidCheckpoint, match="not valid JSON"):
        read_header(f)


def test_normalize_dtype() -> None:
    assert normalize_dtype("bfloat16") == normalize_dtype("bf16") == "BF16"
    with pytest.raises(InvalidRequest, match="int8"):
        normalize_dtype("int8")


# -- checkpoints -----------------------------------------------------------------------------------

def test_open_single_sharded_and_adapter(tmp_path: Path) -> None:
    single = factory.make_base(tmp_path / "single", seed=0)
    ck = open_checkpoint(single)
    assert [h.path for h in ck.files] == [str(single / "model.safetensors")]
    assert ck.extra_files == [str(single / "config.json")]
    sharded = factory.make_base(tmp_path / "sharded", seed=0, shards=3)
    ck3 = open_checkpoint(sharded)
    assert len(ck3.files) == 3 and {t.name for t in ck3.tensors} == set(factory.TINY_SHAPES)
    assert [t.name for t in ck3.tensors][:1] == [ck3.files[0].tensors[0].name]
    assert open_checkpoint(single / "model.safetensors").path == str(single / "model.safetensors")
    ad = open_checkpoint(factory.make_lora(single, tmp_path / "lora", seed=1))
    assert ad.adapter_config is not None and ad.adapter_config["r"] == 4


def test_index_problems(tmp_path: Path) -> None:
    d = factory.make_base(tmp_path / "sh", seed=0, shards=2)
    index_file = d / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    wm = index["weight_map"]
    first = next(iter(wm))

    def with_map(m: dict) -> None:
        index_file.write_text(json.dumps({**index, "weight_map": m}))

    with_map({**wm, first: "model-00009-of-00009.safetensors"})
    with pytest.raises(InvalidCheckpoint, match="missing shard"):
        open_checkpoint(d)
    with_map({**wm, first: "../escape.safetensors"})
    with pytest.raises(InvalidCheckpoint, match="outside the checkpoint"):
        open_checkpoint(d)
    other = "model-00002-of-00002.safetensors" if wm[first].startswith("model-00001") else \
        "model-00001-of-00002.safetensors"
    with_map({**wm, first: other})
    with pytest.raises(InvalidCheckpoint, match=f"{first!r} mapped to"):
        open_checkpoint(d)
    with_map({k: v for k, v in wm.items() if k != first})
    with pytest.raises(InvalidCheckpoint, match="not in the weight_map"):
        open_checkpoint(d)
    with_map({})
    with pytest.raises(InvalidCheckpoint, match="empty weight_map"):
        open_checkpoint(d)


def test_tensor_in_two_files(tmp_path: Path) -> None:
    d = tmp_path / "dup"
    d.mkdir()
    save_file({"w": torch.zeros(2)}, str(d / "a.safetensors"))
    save_file({"w": torch.zeros(2)}, str(d / "b.safetensors"))
    with pytest.raises(InvalidCheckpoint, match="appears in both"):
        open_checkpoint(d)


def test_directory_without_weights(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidCheckpoint, match="no safetensors files"):
        open_checkpoint(tmp_path / "empty")
