"""Ingestion: `scan_model` computes every row of a checkpoint (files, tensors, blocks, delta
statistics) without writing; `write_model` writes them in the caller's transaction."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mergepipe.catalog.connection import Connection, IntegrityError
from mergepipe.catalog.db import Catalog, load_sql
from mergepipe.catalog.delta_norms import check_relative_norm, relative_norms
from mergepipe.catalog.lifecycle import (
    next_version,
    resolve_key,
    resolve_model,
    split_ref,
    version_key,
)
from mergepipe.catalog.models import (
    KINDS,
    FileRow,
    ModelRow,
    find_model,
    get_model,
    model_blocks,
    model_files,
    model_tensors,
)
from mergepipe.catalog.reverify import reverify_file
from mergepipe.catalog.scan import FirstPass, Span, TensorPlan, TensorResult, scan_pinned
from mergepipe.core import checkpoint_limits
from mergepipe.core.errors import (
    Conflict,
    InvalidCheckpoint,
    InvalidRequest,
    NotFound,
    SourceChanged,
)
from mergepipe.core.mergekit_tokenizer import is_vocab_tensor
from mergepipe.core.progress import ProgressFn
from mergepipe.core.vocab import MAX_BLOCK_BYTES, MIN_BLOCK_BYTES, name_problem
from mergepipe.storage.checkpoint import Checkpoint, open_checkpoint
from mergepipe.storage.grid import DEFAULT_BLOCK_BYTES, block_rows, is_element_grid
from mergepipe.storage.lora import lora_targets
from mergepipe.storage.safetensors_format import TensorEntry
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import Stamp

__all__ = ["DEFAULT_BLOCK_BYTES", "KINDS", "ScanFn", "ScannedModel", "ingest_model",
           "TrimGrid", "scan_model", "trim_grids", "write_model"]

# How the blocks are scanned: (plans, the checkpoint's files with their stamps, progress) ->
# (one result per plan, in order; bytes read). `scan_pinned` by default; an engine may spread it
# (executor.ray_ingest: one Ray task per shard file).
ScanFn = Callable[[list[TensorPlan], list[tuple[str, Stamp]], ProgressFn | None],
                  tuple[list[TensorResult], int]]


@dataclass
class ScannedModel:
    """Every catalog row of one model, computed by `scan_model` and written by `write_model`.

    Row tables are column-wise: one list per column, one entry per row.
    """

    model: ModelRow
    files: dict[str, list[Any]]
    tensors: dict[str, list[Any]]
    blocks: dict[str, list[Any]]
    block_stats: dict[str, list[Any]] | None
    tensor_stats: dict[str, list[Any]] | None
    bytes_read: int = 0
    same_as: str | None = None  # the live version holding these very bytes (nothing new)

    @property
    def name(self) -> str:
        """The key of the version: a new one, or the existing one with the same content."""
        return self.same_as or self.model.name


def ingest_model(cat: Catalog, path: str | Path, name: str, *, base: str | None = None,
                 kind: str = "full", block_bytes: int = DEFAULT_BLOCK_BYTES,
                 with_stats: bool = True, progress: ProgressFn | None = None,
                 source_merge: str | None = None,
                 guard: Callable[[Connection], None] | None = None,
                 scan: ScanFn | None = None, force: bool = False) -> ModelRow:
    """Register a checkpoint as model `name` (a base when `base` is None); its models row. An
    existing name gets a new version, unless its latest version has the very same content:
    that version is kept (its files' stamps refreshed). `guard` runs first in the transaction
    that writes the rows (a job's fence); the other arguments are `scan_model`'s."""
    scanned = scan_model(cat, path, name, base=base, kind=kind, block_bytes=block_bytes,
                         with_stats=with_stats, progress=progress, source_merge=source_merge,
                         scan=scan, force=force)
    with cat.transaction() as conn:
        if guard is not None:
            guard(conn)
        write_model(conn, scanned)
    return get_model(cat, scanned.name)


def scan_model(cat: Catalog, path: str | Path, name: str, *, base: str | None = None,
               kind: str = "full", block_bytes: int = DEFAULT_BLOCK_BYTES,
               with_stats: bool = True, progress: ProgressFn | None = None,
               source_merge: str | None = None,
               first_passes: Mapping[str, FirstPass] | None = None,
               scan: ScanFn | None = None, force: bool = False) -> ScannedModel:
    """Read and check the checkpoint, compute all rows; writes nothing to the catalog.

    `first_passes`: the first scan pass of some tensors, already made from the same bytes (a
    merge's output, by the executor while it wrote them); those tensors are not read again,
    except for threshold refinement passes. `scan`: see ScanFn (not with `first_passes`).
    `force`: register an expert even when it is far from its base (catalog.delta_norms).
    """
    t0 = time.perf_counter()
    _check_args(name, kind, base, block_bytes)
    base, current, version, key = _new_version(cat, name, base)
    ckpt = _open(path, kind)
    stamps = _file_stamps(ckpt)
    layout = None if base is None else _BaseLayout.load(cat, base)
    plans, grid_bytes = _plan_tensors(ckpt, layout, kind, block_bytes, with_stats)
    if layout is not None and with_stats and kind == "full":
        layout.check_unchanged(cat)
    _check_blocks(ckpt, plans)
    pins = [(h.path, stamp) for h, stamp in zip(ckpt.files, stamps, strict=True)]
    if scan is None or first_passes:
        results, bytes_read = scan_pinned(plans, pins, progress, resume=first_passes)
    else:
        results, bytes_read = scan(plans, pins, progress)
    if _file_stamps(ckpt) != stamps:
        raise InvalidCheckpoint(f"{ckpt.path}: files changed while being ingested; try again")
    ratio, worst = (None, None) if layout is None else relative_norms(results, layout.norms)
    if base is not None and kind == "full":  # a LoRA or delta file is the update itself: its
        check_relative_norm(ckpt.path, base, ratio, worst, force)  # size says nothing of the base
    model = ModelRow(
        name=key, family=name, version=version,
        kind=kind, path=ckpt.path, base=base, status="ready", error=None,
        has_stats=bool(with_stats and base is not None), block_bytes=grid_bytes,
        n_tensors=len(plans), tensor_bytes=sum(t.nbytes for t in ckpt.tensors),
        lora_scale=_common_scale(plans), source_merge=source_merge,
        ingest_seconds=time.perf_counter() - t0, delta_rel_norm=ratio,
        delta_rel_norm_max=worst)
    # Checkpoint order; a LoRA adapter's tensors keep their base's ordinals.
    ordinals = ([layout.ordinals[p.name] for p in plans] if layout is not None and kind == "lora"
                else list(range(len(plans))))
    scanned = _scanned(model, ckpt, stamps, plans, results, ordinals, bytes_read)
    if current is not None and source_merge is None and _same_content(cat, current, scanned):
        scanned.same_as = current.name
    return scanned


def _new_version(cat: Catalog, name: str, base: str | None
                 ) -> tuple[str | None, ModelRow | None, int, str]:
    """(the exact base version, the name's live version, the new version and its key)."""
    if base is not None:  # the exact version it derives from (not `name`'s: _check_args)
        base = resolve_key(cat, base)
    current = resolve_model(cat, name)
    version = next_version(cat, name)
    key = version_key(name, version)
    if find_model(cat, key) is not None:
        raise Conflict(f"model {key!r} already exists", field="name")
    return base, current, version, key


def _plan_tensors(ckpt: Checkpoint, layout: _BaseLayout | None, kind: str, block_bytes: int,
                  with_stats: bool) -> tuple[list[TensorPlan], int]:
    """(one scan plan per tensor, the block grid's bytes): a base on its own grid, an expert on
    its base's."""
    if layout is None:
        plans = [TensorPlan(t.name, "hash", t, block_rows(t.shape, t.itemsize, block_bytes),
                            value_norm=True)
                 for t in ckpt.tensors]
        return plans, block_bytes
    if block_bytes not in (DEFAULT_BLOCK_BYTES, layout.block_bytes):
        raise InvalidRequest(
            f"experts use the block grid of their base: {layout.name!r} has blocks of "
            f"{layout.block_bytes} bytes, not {block_bytes}", field="block_bytes")
    if kind == "lora":
        return _lora_plans(ckpt, layout, with_stats), layout.block_bytes
    return _expert_plans(ckpt, layout, kind, with_stats), layout.block_bytes


def _scanned(model: ModelRow, ckpt: Checkpoint, stamps: list[Stamp], plans: list[TensorPlan],
             results: list[TensorResult], ordinals: list[int], bytes_read: int) -> ScannedModel:
    """The model's rows, column-wise."""
    files = {h.path: i for i, h in enumerate(ckpt.files)}
    has_stats = model.has_stats
    return ScannedModel(
        model=model,
        files=_columns([{"file_index": i, "path": h.path, "size": stamps[i].size,
                         "mtime_ns": stamps[i].mtime_ns, "header_len": h.header_len,
                         "etag": stamps[i].etag, "version_id": stamps[i].version_id}
                        for i, h in enumerate(ckpt.files)]),
        tensors=_columns([_tensor_row(p, results[k], files, ordinals[k])
                          for k, p in enumerate(plans)]),
        blocks=_columns([_block_row(p, r, i, files) for p, r in zip(plans, results, strict=True)
                         for i in range(len(p.rows))]),
        block_stats=_columns([_block_stats_row(r, i) for r in results
                              for i in range(len(r.hashes))]) if has_stats else None,
        tensor_stats=_columns([_tensor_stats_row(r) for r in results]) if has_stats else None,
        bytes_read=bytes_read,
    )


def write_model(conn: Connection, scanned: ScannedModel, *, replace: bool = False) -> None:
    """Write every row of a scanned model in the caller's transaction; Conflict if it exists.
    The same content as the latest version: only that version's file stamps are refreshed. A
    merge's output takes its name as `_claim_merge_name` says."""
    if scanned.same_as is not None:
        _restamp(conn, scanned)
        return
    name = scanned.name
    if find_model(conn, name) is not None:
        raise Conflict(f"model {name!r} already exists", field="name")
    if scanned.model.source_merge is not None:
        _claim_merge_name(conn, scanned.model, replace)
    base = scanned.model.base
    if base is not None:
        row = find_model(conn, base)
        if row is None or row.status != "ready":
            raise NotFound(f"base model {base!r} is not in the catalog (any more)", field="base")
    _insert_rows(conn, scanned)


def _claim_merge_name(conn: Connection, model: ModelRow, replace: bool) -> None:
    """A merge's output takes its name: Conflict if a live model has it, unless `replace`,
    which retires the name's live versions and any live model in the output directory."""
    family = model.display_name
    if replace:
        conn.execute(load_sql("models_replace"), {"family": family, "path": model.path})
    elif conn.execute(load_sql("model_exists"), {"name": family}).scalar_one():
        raise Conflict(f"model name {family!r} is taken; merge with --overwrite to replace "
                       "it, or remove it first (mergepipe rm)", field="output.name")


def _insert_rows(conn: Connection, scanned: ScannedModel) -> None:
    name = scanned.name
    try:
        conn.execute(load_sql("model_insert"), scanned.model.to_dict())
        for table, cols in (("files_insert", scanned.files), ("tensors_insert", scanned.tensors),
                            ("blocks_insert", scanned.blocks),
                            ("block_stats_insert", scanned.block_stats),
                            ("tensor_stats_insert", scanned.tensor_stats)):
            if cols and next(iter(cols.values())):
                conn.execute(load_sql(table), {"model": name, **cols})
    except IntegrityError:
        raise Conflict(f"model {name!r} already exists", field="name") from None


def _same_content(cat: Catalog, current: ModelRow, scanned: ScannedModel) -> bool:
    """Whether `scanned` holds exactly what version `current` registered: kind, base, grid,
    tensors and every block's content hash at the same place in the same number of files."""
    new = scanned.model
    if (current.kind, current.base, current.has_stats, current.block_bytes, current.n_tensors) \
            != (new.kind, new.base, new.has_stats, new.block_bytes, new.n_tensors):
        return False
    if len(model_files(cat, current.name)) != len(scanned.files.get("path", [])):
        return False
    t = scanned.tensors
    mine = sorted(zip(t["tensor"], t["file_index"], t["dtype"], map(tuple, t["shape"]),
                      t["data_offset"], t["nbytes"], t["lora_a_hash"], t["lora_a_offset"],
                      strict=True))
    theirs = sorted((x.name, x.file_index, x.dtype, x.shape, x.data_offset, x.nbytes,
                     x.lora_a.content_hash if x.lora_a else None,
                     x.lora_a.offset if x.lora_a else None)
                    for x in model_tensors(cat, current.name))
    if mine != theirs:
        return False
    b = scanned.blocks
    mine_b = sorted(zip(b["tensor"], b["block_index"], b["file_index"], b["byte_offset"],
                        b["nbytes"], b["content_hash"], strict=True))
    theirs_b = sorted((x.tensor, x.block_index, x.file_index, x.byte_offset, x.nbytes,
                       x.content_hash) for x in model_blocks(cat, current.name))
    return mine_b == theirs_b


def _restamp(conn: Connection, scanned: ScannedModel) -> None:
    """Re-ingesting the same bytes: the existing version's files, as just read."""
    key = scanned.name
    f = scanned.files
    for i in range(len(f["path"])):
        conn.execute(load_sql("files_restamp"), {"model": key, **{k: f[k][i] for k in f}})
    conn.execute(load_sql("model_path_set"), {"name": key, "path": scanned.model.path})


# -- checks --------------------------------------------------------------------------------------

def _check_blocks(ckpt: Checkpoint, plans: list[TensorPlan]) -> None:
    """InvalidCheckpoint if the grid has more blocks than the cap (each becomes rows in memory
    and in the catalog): counted in closed form, before anything is allocated per block."""
    cap = checkpoint_limits.current().max_blocks
    total = sum(len(p.rows) for p in plans)
    if total > cap:
        big = max(plans, key=lambda p: len(p.rows))
        raise InvalidCheckpoint(
            f"{ckpt.path}: {total} blocks, over the limit of {cap} (MERGEPIPE_MAX_BLOCKS); the "
            f"largest tensor, {big.name!r} of shape {list(big.entry.shape)}, alone has "
            f"{len(big.rows)}: use larger blocks (block_bytes) or raise the limit", field="path")


def _check_args(name: str, kind: str, base: str | None, block_bytes: int) -> None:
    why = name_problem(name)
    if why is not None:
        raise InvalidRequest(f"model name {why}", field="name")
    if kind not in KINDS:
        raise InvalidRequest(f"kind {kind!r} is not one of {', '.join(KINDS)}", field="kind")
    if kind != "full" and base is None:
        raise InvalidRequest(f"a {kind} checkpoint needs --base (the model it applies to)",
                             field="base")
    if base is not None and split_ref(base)[0] == name:
        raise InvalidRequest(f"model {name!r} cannot be its own base", field="base")
    if (isinstance(block_bytes, bool) or not isinstance(block_bytes, int)
            or not MIN_BLOCK_BYTES <= block_bytes <= MAX_BLOCK_BYTES):
        raise InvalidRequest(f"block size {block_bytes!r} must be an integer number of bytes "
                             f"in [{MIN_BLOCK_BYTES}, {MAX_BLOCK_BYTES}]", field="block_bytes")


def _open(path: str | Path, kind: str) -> Checkpoint:
    ckpt = open_checkpoint(path)
    if kind == "lora" and ckpt.adapter_config is None:
        raise InvalidCheckpoint(f"{ckpt.path}: not a PEFT LoRA adapter directory (no "
                                "adapter_config.json)", field="kind")
    if kind != "lora" and ckpt.adapter_config is not None:
        raise InvalidCheckpoint(f"{ckpt.path}: is a PEFT LoRA adapter; ingest it with kind lora",
                                field="kind")
    if not ckpt.tensors:
        raise InvalidCheckpoint(f"{ckpt.path}: the checkpoint has no tensors")
    return ckpt


def _file_stamps(ckpt: Checkpoint) -> list[Stamp]:
    out = []
    for h in ckpt.files:
        try:
            out.append(store_for(h.path).stat(h.path))
        except OSError as e:
            raise InvalidCheckpoint(f"{h.path}: cannot stat ({e.strerror})") from None
    return out


@dataclass
class _BaseLayout:
    """The base model as the catalog has it: files, tensors and the block grid."""

    name: str
    block_bytes: int
    files: list[FileRow]
    tensors: dict[str, TensorEntry]
    ordinals: dict[str, int]
    rows: dict[str, list[tuple[int, int]]]
    hashes: dict[str, list[str]]
    norms: dict[str, float | None]  # tensor -> L2 of its values (None: ingested before 0009)

    @staticmethod
    def load(cat: Catalog, name: str) -> _BaseLayout:
        row = find_model(cat, name)
        if row is None:
            raise NotFound(f"base model {name!r} is not in the catalog; ingest it first",
                           field="base")
        if row.status != "ready":
            raise InvalidRequest(f"base model {name!r} is {row.status}, not ready", field="base")
        if row.base is not None:
            raise InvalidRequest(f"model {name!r} is an expert of {row.base!r}, not a base; "
                                 f"use {row.base!r} as the base", field="base")
        files = model_files(cat, name)
        paths = {f.index: f.path for f in files}
        tensors, ordinals, norms = {}, {}, {}
        for t in model_tensors(cat, name):
            tensors[t.name] = TensorEntry(t.name, t.dtype, t.shape, paths[t.file_index],
                                          t.data_offset, t.nbytes)
            ordinals[t.name] = t.ordinal
            norms[t.name] = t.value_l2
        rows: dict[str, list[tuple[int, int]]] = {n: [] for n in tensors}
        hashes: dict[str, list[str]] = {n: [] for n in tensors}
        for b in model_blocks(cat, name):
            rows[b.tensor].append((b.row_start, b.row_end))
            hashes[b.tensor].append(b.content_hash)
        return _BaseLayout(name, row.block_bytes, files, tensors, ordinals, rows, hashes, norms)

    def check_unchanged(self, cat: Catalog) -> None:
        """SourceChanged if a base file was modified since the base was ingested (a changed
        stamp alone is re-verified by content hash: catalog.reverify)."""
        for f in self.files:
            try:
                st = store_for(f.path).stat(f.path)
            except OSError as e:
                raise SourceChanged(f"base model {self.name!r}: file {f.path} is not "
                                    f"readable ({e.strerror}); re-ingest the base") from None
            change = st.change_from(f.stamp)
            if change is not None:
                reverify_file(cat, self.name, f, st, change, model_tensors(cat, self.name),
                              model_blocks(cat, self.name))


def _expert_plans(ckpt: Checkpoint, base: _BaseLayout, kind: str,
                  with_stats: bool) -> list[TensorPlan]:
    """Plans for a full or delta checkpoint: exactly the base's tensors and shapes."""
    mine = ckpt.by_name()
    missing = [n for n in base.tensors if n not in mine]
    extra = [n for n in mine if n not in base.tensors]
    if missing:
        raise InvalidCheckpoint(f"{ckpt.path}: {len(missing)} tensor(s) of base {base.name!r} "
                                f"missing, e.g. {_names(missing)}")
    if extra:
        raise InvalidCheckpoint(f"{ckpt.path}: {len(extra)} tensor(s) not in base "
                                f"{base.name!r}, e.g. {_names(extra)}")
    plans = []
    for t in ckpt.tensors:
        b = base.tensors[t.name]
        view = _shared_rows(t, b, base.name, kind) if t.shape != b.shape else t
        mode = kind if with_stats else "hash"
        plans.append(TensorPlan(t.name, mode, view, base.rows[t.name],
                                base=b if mode == "full" else None,
                                base_hashes=base.hashes[t.name] if mode == "full" else None,
                                recorded=t if view is not t else None))
    return plans


def _shared_rows(t: TensorEntry, b: TensorEntry, base: str, kind: str) -> TensorEntry:
    """An expert's vocabulary tensor (embeddings, output head) with more rows than the base's
    (a fine-tune that added tokens): recorded with its own shape, its blocks and statistics
    those of the rows it shares with the base (its first rows). A merge uses the tensor only
    through a tokenizer option that re-indexes the embeddings (jobs.reindex reads it whole);
    any other shape difference is refused."""
    extra = (is_vocab_tensor(t.name) and kind == "full" and len(t.shape) == len(b.shape) >= 1
             and t.shape[1:] == b.shape[1:] and t.shape[0] > b.shape[0])
    if not extra:
        more = " (an expert's vocabulary tensor may only have more rows)" \
            if is_vocab_tensor(t.name) and t.shape[1:] == b.shape[1:] else ""
        raise InvalidCheckpoint(f"{t.file}: tensor {t.name!r} has shape {list(t.shape)}, "
                                f"the base {base!r} has {list(b.shape)}{more}")
    return TensorEntry(t.name, t.dtype, b.shape, t.file, t.data_offset,
                       t.nbytes // t.shape[0] * b.shape[0])


def _lora_plans(ckpt: Checkpoint, base: _BaseLayout, with_stats: bool) -> list[TensorPlan]:
    """Plans for a LoRA adapter: the covered base tensors in base order, lora_B on the grid."""
    assert ckpt.adapter_config is not None
    targets = lora_targets(ckpt.adapter_config, ckpt.tensors,
                           {n: t.shape for n, t in base.tensors.items()}, ckpt.path)
    targets.sort(key=lambda tg: base.ordinals[tg.tensor])
    for tg in targets:
        grid = base.rows[tg.tensor]
        if grid and is_element_grid(base.tensors[tg.tensor].shape, grid[-1][1]):
            raise InvalidCheckpoint(
                f"{ckpt.path}: LoRA on tensor {tg.tensor!r} is not supported: a row of it is "
                f"larger than the base {base.name!r}'s block size ({base.block_bytes} bytes), "
                "so its blocks are element ranges, not rows of lora_B")
    return [TensorPlan(tg.tensor, "lora" if with_stats else "hash", tg.b, base.rows[tg.tensor],
                       lora_a=Span(tg.a.file, tg.a.data_offset, tg.a.nbytes),
                       lora_a_dtype=tg.a.dtype, lora_a_shape=tg.a.shape, lora_scale=tg.scale)
            for tg in targets]


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (", ..." if len(names) > 3 else "")


def _common_scale(plans: list[TensorPlan]) -> float | None:
    distinct = {p.lora_scale for p in plans if p.lora_scale is not None}
    return distinct.pop() if len(distinct) == 1 else None


# -- rows ----------------------------------------------------------------------------------------

def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    if not rows:
        return {}
    return {k: [r[k] for r in rows] for k in rows[0]}


def _tensor_row(p: TensorPlan, r: TensorResult, files: dict[str, int], ordinal: int
                ) -> dict[str, Any]:
    a, e = p.lora_a, p.recorded or p.entry
    return {"tensor": p.name, "ordinal": ordinal, "file_index": files[e.file],
            "dtype": e.dtype, "shape": list(e.shape),
            "data_offset": e.data_offset, "nbytes": e.nbytes,
            "n_blocks": len(p.rows),
            "lora_a_file_index": files[a.path] if a else None,
            "lora_a_offset": a.offset if a else None, "lora_a_nbytes": a.nbytes if a else None,
            "lora_a_dtype": p.lora_a_dtype if a else None,
            "lora_a_shape": list(p.lora_a_shape) if a and p.lora_a_shape is not None else None,
            "lora_scale": p.lora_scale, "lora_a_hash": r.lora_a_hash if a else None,
            "value_l2": r.value_l2}


def _block_row(p: TensorPlan, r: TensorResult, i: int, files: dict[str, int]) -> dict[str, Any]:
    span = p.span(i)
    return {"tensor": p.name, "block_index": i, "row_start": p.rows[i][0],
            "row_end": p.rows[i][1], "file_index": files[span.path], "byte_offset": span.offset,
            "nbytes": span.nbytes, "content_hash": r.hashes[i]}


def _block_stats_row(r: TensorResult, i: int) -> dict[str, Any]:
    assert r.stats is not None
    s = r.stats[i]
    return {"tensor": r.name, "block_index": i, "l2": s.l2, "l1": s.l1, "max_abs": s.max_abs,
            "nnz": s.nnz, "col_sq": s.col_sq}


def _tensor_stats_row(r: TensorResult) -> dict[str, Any]:
    assert r.stats is not None and r.trim is not None
    return {"tensor": r.name, "numel": r.trim.numel,
            "l2": math.sqrt(sum(s.l2 * s.l2 for s in r.stats)),
            "l1": sum(s.l1 for s in r.stats), "max_abs": max(s.max_abs for s in r.stats),
            "nnz": sum(s.nnz for s in r.stats), "trim_tau": r.trim.tau,
            "trim_above": r.trim.above, "trim_tied": r.trim.tied}


@dataclass(frozen=True)
class TrimGrid:
    """One expert tensor's TIES trim thresholds on the 1% grid (tensor_stats.trim_*)."""

    numel: int
    tau: list[float]
    above: list[int]
    tied: list[int]


def trim_grids(cat: Catalog, name: str, tensors: set[str]) -> dict[str, TrimGrid]:
    """The trim-threshold grids of some tensors of an expert registered without statistics,
    computed by ingestion's own scan from its files (the rows `ingest` with statistics would
    have stored; a merge needs them for the operators that trim by magnitude). Reads those
    tensors and the base's; a file changed since ingestion is refused (SourceChanged)."""
    model = get_model(cat, name)
    assert model.base is not None
    ckpt = _open(model.path, model.kind)
    recorded = {f.path: f.stamp for f in model_files(cat, name)}
    stamps = _file_stamps(ckpt)
    for h, stamp in zip(ckpt.files, stamps, strict=True):
        was = recorded.get(h.path)
        change = "not registered" if was is None else stamp.change_from(was)
        if change is not None:
            raise SourceChanged(f"{h.path}: changed since model {name!r} was ingested "
                                f"({change}); re-ingest it", field="experts")
    layout = _BaseLayout.load(cat, model.base)
    plans, _ = _plan_tensors(ckpt, layout, model.kind, layout.block_bytes, True)
    plans = [p for p in plans if p.name in tensors]
    pins = [(h.path, s) for h, s in zip(ckpt.files, stamps, strict=True)]
    results, _ = scan_pinned(plans, pins, None)
    return {r.name: TrimGrid(r.trim.numel, list(r.trim.tau), list(r.trim.above),
                             list(r.trim.tied))
            for r in results if r.trim is not None}
