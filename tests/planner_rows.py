"""Catalog rows for planner tests, written directly: tiny families with hand-picked statistics."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from tests.catalogs import new_catalog

INSERT_MODEL = SQL(
    "INSERT INTO models (name, kind, path, base, status, error, has_stats, block_bytes, "
    "n_tensors, tensor_bytes, lora_scale, source_merge) VALUES (:name, :kind, :path, :base, "
    ":status, :error, :has_stats, 100, :n_tensors, :tensor_bytes, :lora_scale, :source_merge)")
INSERT_TENSOR = SQL(
    "INSERT INTO tensors (model, tensor, ordinal, file_index, dtype, shape, data_offset, nbytes, "
    "n_blocks, lora_a_file_index, lora_a_offset, lora_a_nbytes, lora_a_dtype, lora_a_shape) "
    "VALUES (:model, :tensor, :ordinal, 0, 'BF16', :shape, :data_offset, :nbytes, :n_blocks, "
    ":lora_a_file_index, :lora_a_offset, :lora_a_nbytes, :lora_a_dtype, :lora_a_shape)")
INSERT_BLOCK = SQL(
    "INSERT INTO blocks (model, tensor, block_index, row_start, row_end, file_index, "
    "byte_offset, nbytes, content_hash) VALUES (:model, :tensor, :block_index, :block_index, "
    ":row_end, 0, :byte_offset, :nbytes, :content_hash)")
INSERT_BLOCK_STATS = SQL(
    "INSERT INTO block_stats (model, tensor, block_index, l2, l1, max_abs, nnz) "
    "VALUES (:model, :tensor, :block_index, :l2, :l1, :max_abs, :nnz)")
INSERT_TENSOR_STATS = SQL(
    "INSERT INTO tensor_stats (model, tensor, numel, l2, l1, max_abs, nnz, trim_tau, trim_above, "
    "trim_tied) VALUES (:model, :tensor, :numel, :l2, :l1, :max_abs, :nnz, :trim_tau, "
    ":trim_above, :trim_tied)")


@dataclass
class Blk:
    """One block: bytes and the l2 (and max |delta|, default l2) of its delta."""

    nbytes: int
    l2: float = 1.0
    max_abs: float | None = None


@dataclass
class Ten:
    """One tensor: its blocks, LoRA lora_A bytes, and its trim threshold at every density."""

    name: str
    blocks: list[Blk]
    lora_a_nbytes: int | None = None
    tau: float | list[float] = 0.0
    above: int | list[int] = 0
    tied: int | list[int] = 1


@dataclass
class Model:
    name: str
    tensors: list[Ten]
    base: str | None = None
    kind: str = "full"
    has_stats: bool = True
    status: str = "ready"
    error: str | None = None
    lora_scale: float | None = None
    source_merge: str | None = None
    salt: str = ""  # changes every content hash (a re-ingested, changed checkpoint)


def _grid(v: float | int | list[float] | list[int]) -> list[float] | list[int]:
    return list(v) if isinstance(v, list) else [v] * 100


def _hash(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


def add_model(cat: Catalog, m: Model) -> None:
    """Insert a model with its tensors, blocks and (if has_stats) statistics."""
    models, tensors, blocks, bstats, tstats = [], [], [], [], []
    offset = 0
    for ordinal, t in enumerate(m.tensors):
        nbytes = sum(b.nbytes for b in t.blocks)
        lora = t.lora_a_nbytes is not None
        tensors.append({
            "model": m.name, "tensor": t.name, "ordinal": ordinal, "shape": [len(t.blocks), 1],
            "data_offset": offset, "nbytes": nbytes, "n_blocks": len(t.blocks),
            "lora_a_file_index": 0 if lora else None, "lora_a_offset": 0 if lora else None,
            "lora_a_nbytes": t.lora_a_nbytes, "lora_a_dtype": "F32" if lora else None,
            "lora_a_shape": [4, 1] if lora else None})
        for i, b in enumerate(t.blocks):
            blocks.append({"model": m.name, "tensor": t.name, "block_index": i,
                           "row_end": i + 1, "byte_offset": offset, "nbytes": b.nbytes,
                           "content_hash": _hash(m.name, t.name, i, b.l2, m.salt)})
            offset += b.nbytes
            if m.has_stats and m.base is not None:
                mx = b.l2 if b.max_abs is None else b.max_abs
                bstats.append({"model": m.name, "tensor": t.name, "block_index": i, "l2": b.l2,
                               "l1": b.l2 * 2, "max_abs": mx, "nnz": b.nbytes // 2 if b.l2 else 0})
        if m.has_stats and m.base is not None:
            l2 = math.sqrt(sum(b.l2 ** 2 for b in t.blocks))
            tstats.append({"model": m.name, "tensor": t.name, "numel": nbytes // 2, "l2": l2,
                           "l1": l2 * 2, "max_abs": max((b.l2 for b in t.blocks), default=0.0),
                           "nnz": nbytes // 2, "trim_tau": _grid(t.tau),
                           "trim_above": _grid(t.above), "trim_tied": _grid(t.tied)})
    models.append({"name": m.name, "kind": m.kind, "path": f"/models/{m.name}", "base": m.base,
                   "status": m.status, "error": m.error, "has_stats": m.has_stats,
                   "n_tensors": len(m.tensors), "tensor_bytes": offset,
                   "lora_scale": m.lora_scale, "source_merge": m.source_merge})
    with cat.transaction() as conn:
        conn.execute(INSERT_MODEL, models)
        conn.execute(INSERT_TENSOR, tensors)
        conn.execute(INSERT_BLOCK, blocks)
        if bstats:
            conn.execute(INSERT_BLOCK_STATS, bstats)
        if tstats:
            conn.execute(INSERT_TENSOR_STATS, tstats)


def base_like(name: str, expert_tensors: list[Ten]) -> Model:
    """A base with the same block grid (sizes) as the given expert tensors."""
    return Model(name, [Ten(t.name, [Blk(b.nbytes, 0.0) for b in t.blocks])
                        for t in expert_tensors])


# Two experts of base B on one block grid, and a third without statistics (hand-computed plans).
E0 = [Ten("t0", [Blk(100, 4), Blk(100, 0), Blk(100, 1)]), Ten("t1", [Blk(100, 2), Blk(40, 1)])]
E1 = [Ten("t0", [Blk(100, 6), Blk(100, 2), Blk(100, 2)]), Ten("t1", [Blk(100, 0), Blk(40, 3)])]


def two_expert_catalog(folder: Path) -> str:
    """A catalog in `folder` with base B, experts e0 (E0) and e1 (E1), and `nostats` (E1's
    blocks, no statistics)."""
    path = new_catalog(folder, "cat")
    with Catalog(path) as cat:
        add_model(cat, base_like("B", E0))
        add_model(cat, Model("e0", E0, base="B"))
        add_model(cat, Model("e1", E1, base="B"))
        add_model(cat, Model("nostats", E1, base="B", has_stats=False))
    return str(path)
