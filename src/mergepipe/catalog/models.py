"""Registered models: the typed rows of a model, its files, tensors and blocks, and their lookups."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mergepipe.catalog.connection import Connection, Row
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.core.errors import NotFound
from mergepipe.core.vocab import KINDS as KINDS  # re-exported
from mergepipe.storage.store_types import Stamp

Connectable = Catalog | Connection


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


@dataclass(frozen=True)
class TensorRow:
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
    value_l2: float | None = None    # a base's tensor: L2 norm of its values (migration 0009)

    @property
    def row_numel(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n


@dataclass(frozen=True)
class BlockRow:
    """One block: rows [row_start, row_end) of a tensor, stored at byte_offset in a file."""

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
    """The model named `name`, or None."""
    rows = _query(cat, "model_get", {"name": name})
    return model_row(rows[0]) if rows else None


def list_models(cat: Connectable) -> list[ModelRow]:
    """The latest version of every name that is not retired: each base followed by its
    experts, by name."""
    return [model_row(r) for r in _query(cat, "model_list", {})]


def model_files(cat: Connectable, name: str) -> list[FileRow]:
    """The files of a model in checkpoint order."""
    return [_file_row(r) for r in _query(cat, "model_files", {"model": name})]


def model_tensors(cat: Connectable, name: str) -> list[TensorRow]:
    """The tensors of a model in checkpoint order."""
    return [_tensor_row(r) for r in _query(cat, "model_tensors", {"model": name})]


def model_blocks(cat: Connectable, name: str) -> list[BlockRow]:
    """The blocks of a model, tensor by tensor in checkpoint order."""
    return [_block_row(r) for r in _query(cat, "model_blocks", {"model": name})]


def find_models(cat: Connectable, names: Sequence[str]) -> dict[str, ModelRow]:
    """The models of `names` that exist, by name: one query for all."""
    return {str(r.name): model_row(r) for r in _query(cat, "models_named", {"names": list(names)})}


def models_details(cat: Connectable, names: Sequence[str], *,
                   whole: Collection[str] | None = None,
                   named: Sequence[tuple[str, str, int]] = ()
                   ) -> tuple[dict[str, list[FileRow]], dict[str, list[TensorRow]],
                              dict[str, list[BlockRow]]]:
    """model_files, model_tensors and model_blocks of several models in three or four queries
    (each query costs milliseconds: a merge of K experts would make 3 (K + 1)). With `whole`,
    every block is loaded of those models only; of the others, the blocks named in `named`
    ((model, tensor, block_index): a plan's access set) that exist."""
    params = {"models": sorted(set(names))}
    files: dict[str, list[FileRow]] = {n: [] for n in names}
    tensors: dict[str, list[TensorRow]] = {n: [] for n in names}
    blocks: dict[str, list[BlockRow]] = {n: [] for n in names}
    for r in _query(cat, "models_files", params):
        files[str(r.model)].append(_file_row(r))
    for t in _tuples(cat, "models_tensors", params):  # plain tuples: 10^3 tensors a merge
        tensors[str(t[0])].append(_tensor_tuple(t))
    # plain tuples, by position (the columns of models_blocks.sql): 10^4+ blocks a merge
    rows = _tuples(cat, "models_blocks", params if whole is None else
                   {"models": sorted(set(whole))})
    if whole is not None and named:
        rows += _tuples(cat, "blocks_named", {
            "models": sorted({m for m, _, _ in named}),
            "keys": [f"{m}\x1f{t}\x1f{i}" for m, t, i in named]})
    for model, *fields in rows:
        if model in blocks:
            blocks[model].append(BlockRow(*fields))
    return files, tensors, blocks


def model_block_hashes(cat: Connectable, name: str) -> list[tuple[str, int, str]]:
    """(tensor, block_index, content_hash) of every block of a model, in no particular order."""
    return [(str(t), int(i), str(h)) for t, i, h in _tuples(cat, "model_block_hashes",
                                                             {"model": name})]


def _file_row(r: Row) -> FileRow:
    return FileRow(int(r.file_index), str(r.path), int(r.size), int(r.mtime_ns),
                   int(r.header_len), r.etag, r.version_id)


def _tensor_row(r: Row) -> TensorRow:
    lora_a = None
    if r.lora_a_offset is not None:
        lora_a = LoraA(int(r.lora_a_file_index), int(r.lora_a_offset), int(r.lora_a_nbytes),
                       str(r.lora_a_dtype), tuple(int(d) for d in r.lora_a_shape),
                       None if r.lora_a_hash is None else str(r.lora_a_hash))
    return TensorRow(str(r.tensor), int(r.ordinal), int(r.file_index), str(r.dtype),
                     tuple(int(d) for d in r.shape), int(r.data_offset), int(r.nbytes),
                     lora_a, None if r.lora_scale is None else float(r.lora_scale),
                     None if r.value_l2 is None else float(r.value_l2))


def _tensor_tuple(r: tuple[Any, ...]) -> TensorRow:
    """A TensorRow from a row of models_tensors.sql (columns by position)."""
    (_, tensor, ordinal, file_index, dtype, shape, data_offset, nbytes, a_file, a_offset,
     a_nbytes, a_dtype, a_shape, a_hash, lora_scale, value_l2) = r
    lora_a = None
    if a_offset is not None:
        lora_a = LoraA(int(a_file), int(a_offset), int(a_nbytes), str(a_dtype),
                       tuple(int(d) for d in a_shape), None if a_hash is None else str(a_hash))
    return TensorRow(str(tensor), int(ordinal), int(file_index), str(dtype),
                     tuple(int(d) for d in shape), int(data_offset), int(nbytes), lora_a,
                     None if lora_scale is None else float(lora_scale),
                     None if value_l2 is None else float(value_l2))


def _block_row(r: Row) -> BlockRow:
    return BlockRow(str(r.tensor), int(r.block_index), int(r.row_start), int(r.row_end),
                    int(r.file_index), int(r.byte_offset), int(r.nbytes), str(r.content_hash))


def model_row(r: Row) -> ModelRow:
    m = r._mapping
    created = m["created_at"]
    retired = m.get("retired_at")
    return ModelRow(
        name=str(m["name"]), kind=str(m["kind"]), path=str(m["path"]), base=m["base"],
        status=str(m["status"]), error=m["error"], has_stats=bool(m["has_stats"]),
        block_bytes=int(m["block_bytes"]), n_tensors=int(m["n_tensors"]),
        tensor_bytes=int(m["tensor_bytes"]),
        lora_scale=None if m["lora_scale"] is None else float(m["lora_scale"]),
        source_merge=m["source_merge"],
        ingest_seconds=None if m["ingest_seconds"] is None else float(m["ingest_seconds"]),
        created_at=created.isoformat() if isinstance(created, datetime) else created,
        family=m.get("family"), version=int(m.get("version") or 1),
        retired_at=retired.isoformat() if isinstance(retired, datetime) else retired,
        delta_rel_norm=_float(m["delta_rel_norm"]), delta_rel_norm_max=_float(m["delta_rel_norm_max"]))


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _tuples(cat: Connectable, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    if isinstance(cat, Catalog):
        with cat.reader() as conn:
            return conn.execute(load_sql(name), params).tuples()
    return cat.execute(load_sql(name), params).tuples()


def _query(cat: Connectable, name: str, params: dict[str, Any]) -> list[Row]:
    if isinstance(cat, Catalog):
        return cat.query(name, params)
    return list(cat.execute(load_sql(name), params))
