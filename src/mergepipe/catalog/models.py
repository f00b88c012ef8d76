"""Registered models: the typed rows of a model, its files, tensors and blocks, and their lookups."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from mergepipe.catalog.connection import Row, as_dataclass
from mergepipe.catalog.db import Connectable, run
from mergepipe.core.errors import NotFound
from mergepipe.core.vocab import KINDS as KINDS  # re-exported
from mergepipe.storage.store_types import Stamp


@dataclass(frozen=True)
class ModelRow:
    """One row of `models`."""

    name: str
    kind: str                   # full | delta | lora
    path: str                   # directory or file as given at ingestion (absolute)
    base: str | None            # None for a base model
    status: str                 # ingesting | ready | failed
    error: str | None
    has_stats: bool
    block_bytes: int
    n_tensors: int
    tensor_bytes: int
    lora_scale: float | None
    source_merge: str | None    # the merge that produced it, if any
    ingest_seconds: float | None
    created_at: str | None = None  # ISO 8601
    family: str | None = None      # the name users give; `name` keys this version
    version: int = 1               # name is family for version 1, family~N after
    retired_at: str | None = None  # ISO 8601; removed from listings, rows kept
    # an expert: ||E - B|| / ||B|| over its tensors, and the largest of one tensor (None: a
    # base, no statistics, or a base ingested before migration 0009; catalog.delta_norms)
    delta_rel_norm: float | None = None
    delta_rel_norm_max: float | None = None

    @property
    def display_name(self) -> str:
        """The name users give (the family), whatever the version."""
        return self.family or self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FileRow:
    """One registered file: where it is (a path or a URL) and how it looked at ingestion."""

    index: int
    path: str
    size: int
    mtime_ns: int
    header_len: int = 0
    etag: str | None = None        # remote objects only
    version_id: str | None = None  # remote objects in a versioned bucket

    @property
    def stamp(self) -> Stamp:
        return Stamp(self.size, self.mtime_ns, self.etag, self.version_id)


@dataclass(frozen=True)
class LoraA:
    """The lora_A matrix of one adapted tensor: read once per touched tensor."""

    file_index: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    content_hash: str | None = None  # xxh3-128 of the raw bytes (None: ingested before 0004)


class TensorRow(NamedTuple):
    """One registered tensor (LoRA: the lora_B matrix, plus lora_A). A tuple, as BlockRow: a
    merge's check builds 10^3 of them."""

    name: str
    ordinal: int
    file_index: int
    dtype: str
    shape: tuple[int, ...]
    data_offset: int
    nbytes: int
    lora_a: LoraA | None = None
    lora_scale: float | None = None  # LoRA: this module's scale (rank/alpha patterns differ)
    value_l2: float | None = None    # a base's tensor: L2 norm of its values (migration 0009)

    @property
    def row_numel(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


class BlockRow(NamedTuple):
    """One block: rows [row_start, row_end) of a tensor, stored at byte_offset in a file. A
    tuple (a frozen dataclass costs 10x as much to build, and a merge's check builds 10^4)."""

    tensor: str
    block_index: int
    row_start: int
    row_end: int
    file_index: int
    byte_offset: int
    nbytes: int
    content_hash: str


def get_model(cat: Connectable, name: str) -> ModelRow:
    """The model named `name`; NotFound if absent."""
    row = find_model(cat, name)
    if row is None:
        raise NotFound(f"model {name!r} is not in the catalog", field="model")
    return row


def find_model(cat: Connectable, name: str) -> ModelRow | None:
    row = run(cat, "model_get", {"name": name}).first()
    return None if row is None else model_row(row)


def list_models(cat: Connectable) -> list[ModelRow]:
    """The latest version of every name that is not retired: each base, then its experts."""
    return [model_row(r) for r in run(cat, "model_list")]


def model_files(cat: Connectable, name: str) -> list[FileRow]:
    return [FileRow(*t) for t in run(cat, "model_files", {"model": name}).tuples()]


def model_tensors(cat: Connectable, name: str) -> list[TensorRow]:
    return [_tensor(t) for t in run(cat, "model_tensors", {"model": name}).tuples()]


def model_blocks(cat: Connectable, name: str) -> list[BlockRow]:
    return [BlockRow(*t) for t in run(cat, "model_blocks", {"model": name}).tuples()]


def find_models(cat: Connectable, names: Sequence[str]) -> dict[str, ModelRow]:
    """The models of `names` that exist, by name: one query for all."""
    return {str(r.name): model_row(r) for r in run(cat, "models_named", {"names": list(names)})}


def models_files(cat: Connectable, names: Sequence[str]) -> dict[str, list[FileRow]]:
    """The files of several models in one query, by model, each in checkpoint order."""
    files: dict[str, list[FileRow]] = {n: [] for n in names}
    for model, *f in run(cat, "models_files", {"models": sorted(set(names))}).tuples():
        files[model].append(FileRow(*f))
    return files


def models_tensors(cat: Connectable, names: Sequence[str]) -> dict[str, list[TensorRow]]:
    """The tensors of several models in one query, by model, each in checkpoint order."""
    tensors: dict[str, list[TensorRow]] = {n: [] for n in names}
    for model, *t in run(cat, "models_tensors", {"models": sorted(set(names))}).tuples():
        tensors[model].append(_tensor(t))
    return tensors


def models_blocks(cat: Connectable, names: Sequence[str]) -> dict[str, list[BlockRow]]:
    """Every block of several models in one query, by model, each in file order."""
    blocks: dict[str, list[BlockRow]] = {n: [] for n in names}
    for model, *fields in run(cat, "models_blocks", {"models": sorted(set(names))}).tuples():
        blocks[model].append(BlockRow(*fields))
    return blocks


def blocks_named(cat: Connectable, named: Collection[tuple[str, str, int]]
                 ) -> dict[str, list[BlockRow]]:
    """The blocks named by (model, tensor, block_index) that exist, by model, in no order."""
    blocks: dict[str, list[BlockRow]] = {m: [] for m, _, _ in named}
    if named:
        for model, *fields in run(cat, "blocks_named", {
                "models": sorted(blocks), "keys": [f"{m}\x1f{t}\x1f{i}" for m, t, i in named]}
                                  ).tuples():
            blocks[model].append(BlockRow(*fields))
    return blocks


def model_block_hashes(cat: Connectable, name: str) -> list[tuple[str, int, str]]:
    """(tensor, block_index, content_hash) of every block of a model, in no particular order."""
    return run(cat, "model_block_hashes", {"model": name}).tuples()


def _tensor(r: Sequence[Any]) -> TensorRow:
    """A TensorRow from a row of model(s)_tensors.sql (columns by position)."""
    (tensor, ordinal, file_index, dtype, shape, data_offset, nbytes, a_file, a_offset,
     a_nbytes, a_dtype, a_shape, a_hash, lora_scale, value_l2) = r
    lora_a = None
    if a_offset is not None:
        lora_a = LoraA(a_file, a_offset, a_nbytes, a_dtype, tuple(a_shape), a_hash)
    return TensorRow(tensor, ordinal, file_index, dtype, tuple(shape), data_offset, nbytes,
                     lora_a, lora_scale, value_l2)


def model_row(r: Row) -> ModelRow:
    row = as_dataclass(ModelRow, r)
    return row if row.version else dataclasses.replace(row, version=1)
