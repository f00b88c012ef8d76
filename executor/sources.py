"""What the executor knows of each input model, loaded from the catalog, and drift checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import xxhash
from mergepipe.catalog.db import Catalog, register_sql_package

from mergepipe.core.errors import InvalidRequest, NotFound, SourceChanged

register_sql_package("mergepipe.executor")


@dataclass(frozen=True)
class FileInfo:
    """One registered file: where it is and how it looked at ingestion."""

    index: int
    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class LoraA:
    """The lora_A matrix of one adapted tensor: read once per touched tensor."""

    file_index: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    content_hash: str | None = None  # xxh3-128 of the raw bytes (None: ingested before 0004)


@dataclass(frozen=True)
class TensorInfo:
    """One registered tensor (LoRA: the lora_B matrix, plus lora_A)."""

    name: str
    ordinal: int
    file_index: int
    dtype: str
    shape: tuple[int, ...]
    data_offset: int
    nbytes: int
    lora_a: LoraA | None = None
    lora_scale: float | None = None  # LoRA: this module's scale (rank/alpha patterns differ)

    @property
    def row_numel(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


@dataclass(frozen=True)
class BlockInfo:
    """One block: rows [row_start, row_end) of a tensor, stored at byte_offset in a file."""

    tensor: str
    block_index: int
    row_start: int
    row_end: int
    file_index: int
    byte_offset: int
    nbytes: int
    content_hash: str


@dataclass
class ModelSource:
    """A catalog model as the executor reads it."""

    name: str
    kind: str
    path: str
    base: str | None
    lora_scale: float | None
    files: dict[int, FileInfo]
    tensors: dict[str, TensorInfo]  # in checkpoint order
    blocks: dict[tuple[str, int], BlockInfo] = field(default_factory=dict)

    def file_path(self, index: int) -> str:
        return self.files[index].path

    def tensor_blocks(self, tensor: str) -> list[BlockInfo]:
        """The blocks of one tensor in row order."""
        info = self.tensors[tensor]
        out = []
        i = 0
        while (tensor, i) in self.blocks:
            out.append(self.blocks[(tensor, i)])
            i += 1
        if not out:
            raise InvalidRequest(f"model {self.name!r}: tensor {info.name!r} has no blocks in the "
                                 "catalog; re-ingest the model", field="base")
        return out

    def check_files(self) -> None:
        """Raise SourceChanged if a file is gone or its size or mtime differ from ingestion."""
        for f in self.files.values():
            try:
                st = os.stat(f.path)
            except OSError as e:
                raise SourceChanged(
                    f"model {self.name!r}: file {f.path} is not readable ({e.strerror}); it was "
                    f"moved or deleted after ingestion: restore it or re-ingest {self.name!r}"
                ) from None
            if st.st_size != f.size or st.st_mtime_ns != f.mtime_ns:
                raise SourceChanged(
                    f"model {self.name!r}: file {f.path} changed after ingestion (size "
                    f"{f.size} -> {st.st_size}, mtime_ns {f.mtime_ns} -> {st.st_mtime_ns}); "
                    f"re-ingest {self.name!r} before merging it")

    def verify_block(self, block: BlockInfo, raw: bytes | bytearray | memoryview) -> None:
        """Raise SourceChanged unless `raw` has the block's catalogued xxh3-128 content hash."""
        got = xxhash.xxh3_128_hexdigest(raw)
        if got != block.content_hash:
            raise SourceChanged(
                f"model {self.name!r}: tensor {block.tensor!r} block {block.block_index} in "
                f"{self.file_path(block.file_index)} (bytes {block.byte_offset}.."
                f"{block.byte_offset + block.nbytes}) does not match the catalog's content hash: "
                f"the file changed after ingestion; re-ingest {self.name!r}")

    def verify_lora_a(self, tensor: str, spec: LoraA, raw: bytes | bytearray | memoryview
                      ) -> None:
        """Raise SourceChanged unless `raw` has lora_A's catalogued xxh3-128 content hash (no
        check for a catalog row from before migration 0004, which has no hash)."""
        if spec.content_hash is None:
            return
        got = xxhash.xxh3_128_hexdigest(raw)
        if got != spec.content_hash:
            raise SourceChanged(
                f"model {self.name!r}: tensor {tensor!r} lora_A in "
                f"{self.file_path(spec.file_index)} (bytes {spec.offset}.."
                f"{spec.offset + spec.nbytes}) does not match the catalog's content hash: "
                f"the file changed after ingestion; re-ingest {self.name!r}")


def load_model(cat: Catalog, name: str) -> ModelSource:
    """Files, tensors and blocks of a ready model; NotFound / InvalidRequest otherwise."""
    rows = cat.query("exec_model", {"name": name})
    if not rows:
        raise NotFound(f"model {name!r} is not in the catalog", field="model")
    m = rows[0]._mapping
    if m["status"] != "ready":
        raise InvalidRequest(f"model {name!r} is {m['status']}, not ready", field="model")
    files = {int(r.file_index): FileInfo(int(r.file_index), str(r.path), int(r.size),
                                         int(r.mtime_ns))
             for r in cat.query("exec_files", {"model": name})}
    tensors = {}
    for r in cat.query("exec_tensors", {"model": name}):
        lora_a = None
        if r.lora_a_offset is not None:
            lora_a = LoraA(int(r.lora_a_file_index), int(r.lora_a_offset), int(r.lora_a_nbytes),
                           str(r.lora_a_dtype), tuple(int(d) for d in r.lora_a_shape),
                           None if r.lora_a_hash is None else str(r.lora_a_hash))
        tensors[str(r.tensor)] = TensorInfo(
            str(r.tensor), int(r.ordinal), int(r.file_index), str(r.dtype),
            tuple(int(d) for d in r.shape), int(r.data_offset), int(r.nbytes), lora_a,
            None if r.lora_scale is None else float(r.lora_scale))
    blocks = {(str(r.tensor), int(r.block_index)): BlockInfo(
        str(r.tensor), int(r.block_index), int(r.row_start), int(r.row_end), int(r.file_index),
        int(r.byte_offset), int(r.nbytes), str(r.content_hash))
        for r in cat.query("exec_blocks", {"model": name})}
    return ModelSource(name, str(m["kind"]), str(m["path"]), m["base"],
                       None if m["lora_scale"] is None else float(m["lora_scale"]),
                       files, tensors, blocks)
