"""Parse safetensors headers ourselves and convert raw tensor bytes to and from float32."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mergepipe.core import checkpoint_limits
from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.core.vocab import DTYPE_SIZES, HF_DTYPE_NAMES
from mergepipe.storage import bounded_json
from mergepipe.storage.locations import absolute
from mergepipe.storage.storage import RangeReader, open_reader

if TYPE_CHECKING:
    import torch

# Bounds on what a header may make us build (the safetensors library allows 100 MB of header;
# an 18 MB header of 300k empty tensors took 1.3 GB and 39 s to ingest). A shard of a real
# checkpoint has at most a few thousand tensors and a header of well under 1 MB. The caps on
# the file's size, its tensor count and a tensor's elements are the settings'
# (core.checkpoint_limits).
MAX_HEADER_BYTES = 16 << 20
MAX_NAME_CHARS = 1024


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (imports torch)."""
    import torch

    dtype: torch.dtype = getattr(torch, HF_DTYPE_NAMES[name])
    return dtype


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: where its bytes are and how to read them."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str  # absolute path
    data_offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    header_len: int  # 8 + JSON bytes: where the data section starts
    size: int
    metadata: dict[str, str]
    tensors: list[TensorEntry]  # in data-offset order


def read_header(path: str | os.PathLike[str], reader: RangeReader | None = None
                ) -> SafetensorsHeader:
    """Parse and check one safetensors file's header, reading only its bytes (through `reader`)."""
    path = absolute(path)
    limits = checkpoint_limits.current()
    size, n, raw = _header_bytes(path, reader, limits.max_file_bytes)
    header, metadata = _parse_header(path, raw)
    if len(header) > limits.max_tensors_per_file:
        raise InvalidCheckpoint(f"{path}: {len(header)} tensors in one file, over the limit of "
                                f"{limits.max_tensors_per_file} (MERGEPIPE_MAX_TENSORS_PER_FILE)",
                                field="path")
    data_start = 8 + n
    data_len = size - data_start
    entries = []
    for name, info in header.items():
        entries.append(_entry(path, name, info, data_start, data_len,
                              limits.max_tensor_elements))
    entries.sort(key=lambda t: (t.data_offset, t.nbytes, t.name))
    _check_tiling(path, entries, data_start, size)
    return SafetensorsHeader(path, data_start, size, {str(k): str(v) for k, v in metadata.items()},
                             entries)


def _header_bytes(path: str, reader: RangeReader | None, max_file_bytes: int
                  ) -> tuple[int, int, bytes]:
    """(the file's size, its header's length, its JSON bytes), checked against the limits."""
    with contextlib.nullcontext(reader) if reader else open_reader(random_access=True) as reader:
        size = reader.size(path)
        if size > max_file_bytes:
            raise InvalidCheckpoint(f"{path}: {size} bytes, over the limit of "
                                    f"{max_file_bytes} for one checkpoint file "
                                    "(MERGEPIPE_MAX_FILE_BYTES)", field="path")
        if size < 8:
            raise InvalidCheckpoint(f"{path}: file too short for a safetensors header")
        (n,) = struct.unpack("<Q", reader.read(path, 0, 8))
        if n > MAX_HEADER_BYTES:
            raise InvalidCheckpoint(f"{path}: header length {n} exceeds the {MAX_HEADER_BYTES} limit")
        if 8 + n > size:
            raise InvalidCheckpoint(f"{path}: header length {n} is larger than the file ({size} bytes)")
        return size, n, bytes(reader.read(path, 8, n))


def _parse_header(path: str, raw: bytes) -> tuple[dict[str, Any], dict[Any, Any]]:
    """(tensor name -> entry, __metadata__) of a header's JSON bytes."""
    try:
        header = bounded_json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, IntegerTooLong
        raise InvalidCheckpoint(f"{path}: header is not valid JSON ({e})") from None
    except RecursionError:
        raise InvalidCheckpoint(f"{path}: header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise InvalidCheckpoint(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise InvalidCheckpoint(f"{path}: __metadata__ is not an object")
    return header, metadata


def _check_tiling(path: str, entries: list[TensorEntry], data_start: int, size: int) -> None:
    """The tensors tile the data section exactly (no overlap, no gap, no trailing bytes)."""
    end = data_start
    for t in entries:
        if t.data_offset < end:
            raise InvalidCheckpoint(f"{path}: tensor {_name(t.name)} overlaps the previous tensor")
        if t.data_offset > end:
            raise InvalidCheckpoint(f"{path}: {t.data_offset - end} bytes of gap before tensor "
                                    f"{_name(t.name)} (the tensors must tile the data section)")
        end = t.data_offset + t.nbytes
    if end != size:
        raise InvalidCheckpoint(f"{path}: {size - end} trailing bytes after the last tensor "
                                "(the tensors must tile the data section)")


def _name(name: str) -> str:
    r = repr(name)
    return r if len(r) <= 120 else r[:117] + "..."


_CONTROL = re.compile("[\x00-\x1f\x7f]")  # control characters, refused in tensor names


def _entry(path: str, name: str, info: object, data_start: int, data_len: int,
           max_elements: int) -> TensorEntry:
    if len(name) > MAX_NAME_CHARS or _CONTROL.search(name):
        raise InvalidCheckpoint(f"{path}: tensor {_name(name)}: a name of over "
                                f"{MAX_NAME_CHARS} characters or with control characters")
    if not isinstance(info, dict):
        raise InvalidCheckpoint(f"{path}: tensor {name!r}: entry is not an object")
    dtype, shape, offsets = _entry_fields(path, name, info)
    begin, end = offsets
    numel = math.prod(shape)
    if numel > max_elements:
        raise InvalidCheckpoint(f"{path}: tensor {name!r}: shape {shape} has {numel} elements, "
                                f"over the limit of {max_elements} "
                                "(MERGEPIPE_MAX_TENSOR_ELEMENTS)", field="path")
    if not 0 <= begin <= end:
        raise InvalidCheckpoint(f"{path}: tensor {name!r}: data_offsets {offsets} out of order")
    if end > data_len:
        raise InvalidCheckpoint(
            f"{path}: tensor {name!r}: data_offsets {offsets} run past the end of the file "
            f"(data section is {data_len} bytes; truncated file?)")
    if end - begin != numel * DTYPE_SIZES[dtype]:
        raise InvalidCheckpoint(
            f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} of {dtype}")
    return TensorEntry(name, dtype, tuple(shape), path, data_start + begin, end - begin)


def _entry_fields(path: str, name: str, info: dict[Any, Any]
                  ) -> tuple[str, list[int], list[int]]:
    """An entry's dtype, shape and data_offsets, each of the right type."""
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise InvalidCheckpoint(
            f"{path}: tensor {name!r}: dtype {dtype!r} unsupported (F32, F16, BF16)")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**48
                       for d in shape)):
        raise InvalidCheckpoint(f"{path}: tensor {name!r}: invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise InvalidCheckpoint(f"{path}: tensor {name!r}: invalid data_offsets {offsets!r}")
    return dtype, shape, offsets


def to_float32(raw: bytes | bytearray | memoryview, dtype: str,
               shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Raw little-endian tensor bytes -> a float32 torch tensor (a copy, writable)."""
    import torch

    buf = bytearray(raw) if isinstance(raw, bytes) else raw  # frombuffer wants it writable
    t = decode_into(buf, dtype, torch.empty(len(raw) // DTYPE_SIZES[dtype], dtype=torch.float32))
    return t.reshape(shape) if shape is not None else t


def decode_into(raw: bytes | bytearray | memoryview, dtype: str, out: torch.Tensor) -> torch.Tensor:
    """Raw little-endian floats -> the flat float32 tensor `out` (same element count), in place."""
    import torch

    if out.numel() == 0:
        return out
    if dtype == "BF16":
        # bf16 is the top half of a float32: widening by a shift is exact and several times
        # faster than torch's bf16 -> f32 conversion on CPU.
        wide = out.view(torch.int32)
        wide.copy_(torch.frombuffer(raw, dtype=torch.int16))
        wide.bitwise_left_shift_(16)
    else:
        out.copy_(torch.frombuffer(raw, dtype=torch_dtype(dtype)))
    return out


def decode_array_into(raw: bytes | bytearray | memoryview, dtype: str, out: np.ndarray
                      ) -> np.ndarray:
    """`decode_into` for a flat float32 numpy array, without torch."""
    if out.size == 0:
        return out
    if dtype == "BF16":
        wide = out.view(np.uint32)
        wide[:] = np.frombuffer(raw, dtype=np.uint16)
        np.left_shift(wide, 16, out=wide)
    else:
        out[:] = np.frombuffer(raw, dtype=np.float16 if dtype == "F16" else np.float32)
    return out


def encode(t: torch.Tensor, dtype: str) -> memoryview:
    """A float32 tensor -> its raw bytes in `dtype` (round to nearest even, as torch does)."""
    import torch  # loaded by the caller's tensor already

    out = t.to(torch_dtype(dtype)).contiguous()
    return out.reshape(-1).view(torch.uint8).numpy().data


def from_float32(t: torch.Tensor, dtype: str) -> bytes:
    """`encode`'s bytes, copied."""
    return bytes(encode(t, dtype))


def encode_header(entries: list[tuple[str, str, tuple[int, ...]]],
                  metadata: dict[str, str] | None = None) -> tuple[bytes, list[tuple[int, int]]]:
    """Header bytes (length prefix + JSON, padded to 8) and each tensor's (begin, end)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    spans = []
    pos = 0
    for name, dtype, shape in entries:
        n = DTYPE_SIZES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        spans.append((pos, pos + n))
        pos += n
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-(len(js) + 8) % 8)
    return struct.pack("<Q", len(js)) + js, spans
