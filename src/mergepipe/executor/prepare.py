"""A merge's inputs as the executor reads them, and the plan checked against catalog and files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import (
    BlockRow,
    FileRow,
    LoraA,
    ModelRow,
    TensorRow,
    blocks_named,
    find_models,
    model_blocks,
    models_blocks,
    models_files,
    models_tensors,
)
from mergepipe.catalog.reverify import reverify_file
from mergepipe.core.errors import (
    BudgetViolation,
    InvalidCheckpoint,
    InvalidRequest,
    NotFound,
    SourceChanged,
)
from mergepipe.executor.fallback_trims import fill_fallback_trims
from mergepipe.planner.plan import BlockRows, Plan
from mergepipe.storage.checkpoint import Checkpoint, open_checkpoint
from mergepipe.storage.locations import absolute, basename
from mergepipe.storage.store import store_for


@dataclass
class ModelSource:
    """A catalog model as the executor reads it."""

    name: str
    kind: str
    path: str
    base: str | None
    lora_scale: float | None
    files: dict[int, FileRow]
    tensors: dict[str, TensorRow]  # in checkpoint order
    blocks: dict[tuple[str, int], BlockRow] = field(default_factory=dict)
    # False: `blocks` holds only the blocks a plan reads (prepare);
    # complete_blocks loads the rest when every block is needed (a re-verification)
    complete: bool = True

    def complete_blocks(self, cat: Catalog) -> dict[tuple[str, int], BlockRow]:
        if not self.complete:
            self.blocks = {(b.tensor, b.block_index): b for b in model_blocks(cat, self.name)}
            self.complete = True
        return self.blocks

    def file_path(self, index: int) -> str:
        return self.files[index].path

    def tensor_blocks(self, tensor: str) -> list[BlockRow]:
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

    def check_files(self, cat: Catalog) -> None:
        """Raise SourceChanged if a file is gone or differs from ingestion."""
        for f in list(self.files.values()):
            try:
                st = store_for(f.path).stat(f.path)
            except OSError as e:
                raise SourceChanged(
                    f"model {self.name!r}: file {f.path} is not readable ({e.strerror}); it was "
                    f"moved or deleted after ingestion: restore it or re-ingest {self.name!r}"
                ) from None
            change = st.change_from(f.stamp)
            if change is not None:
                self.files[f.index] = reverify_file(cat, self.name, f, st, change,
                                                    list(self.tensors.values()),
                                                    list(self.complete_blocks(cat).values()))

    def verify_block(self, block: BlockRow, raw: bytes | bytearray | memoryview) -> None:
        self._verify(raw, block.content_hash, f"tensor {block.tensor!r} block {block.block_index}",
                     block.file_index, block.byte_offset, block.nbytes)

    def verify_lora_a(self, tensor: str, spec: LoraA, raw: bytes | bytearray | memoryview
                      ) -> None:
        """Raise SourceChanged unless `raw` has lora_A's catalogued hash (if the row has one)."""
        if spec.content_hash is not None:
            self._verify(raw, spec.content_hash, f"tensor {tensor!r} lora_A", spec.file_index,
                         spec.offset, spec.nbytes)

    def _verify(self, raw: bytes | bytearray | memoryview, content_hash: str, what: str,
                file_index: int, offset: int, nbytes: int) -> None:
        if xxhash.xxh3_128_hexdigest(raw) != content_hash:
            raise SourceChanged(
                f"model {self.name!r}: {what} in {self.file_path(file_index)} (bytes {offset}.."
                f"{offset + nbytes}) does not match the catalog's content hash: "
                f"the file changed after ingestion; re-ingest {self.name!r}")


@dataclass(frozen=True)
class Inputs:
    """The catalog rows of a merge's models that its plan does not change (`read_inputs`): read
    beside the planner, then checked against the plan by `prepare`."""

    names: tuple[str, ...]  # the base first, then the experts
    rows: dict[str, ModelRow]
    files: dict[str, list[FileRow]]
    tensors: dict[str, list[TensorRow]]  # every model's, all of its tensors
    base_blocks: list[BlockRow]
    promoted: frozenset[str]  # Prepared.promoted


def read_inputs(cat: Catalog, names: Sequence[str]) -> Inputs:
    """The named models' rows (ready ones only), files and tensors, and the first model's (the
    base's) blocks, on one connection; and the tensors whose dtype differs between the base and
    the full models among the others."""
    with cat.reader() as conn:
        rows = _ready_models(conn, names)
        files, tensors = models_files(conn, names), models_tensors(conn, names)
        base_blocks = models_blocks(conn, names[:1])[names[0]]
    dtypes: dict[str, set[str]] = {}
    for n in [names[0], *(n for n in names[1:] if rows[n].kind == "full")]:
        for t in tensors[n]:
            dtypes.setdefault(t.name, set()).add(t.dtype)
    return Inputs(tuple(names), rows, files, tensors, base_blocks,
                  frozenset(t for t, d in dtypes.items() if len(d) > 1))


def _ready_models(conn: Connection, names: Sequence[str]) -> dict[str, ModelRow]:
    rows = find_models(conn, names)
    for name in names:
        m = rows.get(name)
        if m is None:
            raise NotFound(f"model {name!r} is not in the catalog", field="model")
        if m.status != "ready":
            raise InvalidRequest(f"model {name!r} is {m.status}, not ready", field="model")
    return rows


def _source(m: ModelRow, files: Sequence[FileRow], tensors: Sequence[TensorRow],
            blocks: Sequence[BlockRow], *, complete: bool) -> ModelSource:
    return ModelSource(m.name, m.kind, m.path, m.base, m.lora_scale,
                       {f.index: f for f in files}, {t.name: t for t in tensors},
                       {(b.tensor, b.block_index): b for b in blocks}, complete=complete)


def _planned_sources(cat: Catalog, inputs: Inputs, planned: Sequence[tuple[str, str, int]],
                     known: BlockRows | None) -> list[ModelSource]:
    """The models of `inputs` as a plan reads them: the base whole, of the experts the planned
    blocks (from `known`, the planner's rows, for the models whose rows it read; the rest in
    one query)."""
    usable = known if known is not None and known.catalog == str(cat.location) else None
    got = _planned_blocks(cat, planned, usable, inputs.rows)
    base = inputs.names[0]
    return [_source(inputs.rows[n], inputs.files[n], inputs.tensors[n],
                    inputs.base_blocks if n == base else got.get(n, ()), complete=n == base)
            for n in inputs.names]


def _planned_blocks(cat: Catalog, planned: Sequence[tuple[str, str, int]],
                    known: BlockRows | None, rows: Mapping[str, ModelRow]
                    ) -> dict[str, list[BlockRow]]:
    """The catalog rows of the planned blocks, by model: from `known` (read of this catalog)
    for the models whose rows are the ones it read, the rest in one query."""
    have: dict[tuple[str, str, int], tuple[Any, ...]] = {}
    if known is not None:
        same = {n for n, c in known.created.items()
                if c is not None and n in rows and rows[n].created_at == c}
        have = {(r[0], r[1], r[2]): r for r in known.rows if r[0] in same}
    out: dict[str, list[BlockRow]] = {}
    missing = []
    for key in planned:
        r = have.get(key)
        if r is None:
            missing.append(key)
        else:
            out.setdefault(key[0], []).append(BlockRow(r[1], r[2], r[6], r[7], r[8], r[9], r[3],
                                                       r[5]))
    if missing:
        with cat.reader() as conn:
            named = blocks_named(conn, missing)
        for n, got in named.items():
            out.setdefault(n, []).extend(got)
    return out


@dataclass
class Prepared:
    """A plan checked against the catalog and the files on disk, ready to execute."""

    plan: Plan
    base: ModelSource
    experts: list[ModelSource]
    checkpoint: Checkpoint
    selected: dict[tuple[int, str], list[BlockRow]]  # (expert position, tensor) -> blocks
    planned_by_model: dict[str, int]
    out_dtype: str | None  # None: each tensor keeps the base's dtype
    # the tensors whose dtype differs between the base and a full expert: their inputs'
    # promoted dtype is F32 (ChunkMerger.input_dtype)
    promoted: frozenset[str] = frozenset()

    @property
    def mergekit_arith(self) -> bool:
        """Every block runs through the operator (mergekit's casts, or whole-tensor operators)."""
        params = self.plan.request.params
        return (params.get("semantics") == "mergekit"
                or params.get("compute_dtype", "float32") != "float32"
                or self.plan.request.whole_tensor is not None)

    @property
    def planned_bytes(self) -> int:
        return sum(self.planned_by_model.values())


def prepare(cat: Catalog, plan: Plan, inputs: Inputs | None = None) -> Prepared:
    """Load the inputs, check the files are unchanged and the plan fits the budget. `inputs`:
    the models read already (`read_inputs`, e.g. while it was planned), used if they are the
    plan's."""
    req = plan.request
    names = (req.base, *(e.model for e in req.experts))
    if inputs is None or inputs.names != names:  # e.g. an incremental plan's executed request
        inputs = read_inputs(cat, names)
    base, *experts = _planned_sources(cat, inputs, [(b.model, b.tensor, b.block_index)
                                                    for b in plan.blocks], plan.block_rows)
    plan.block_rows = None  # now in the experts' blocks: not kept twice through the merge
    _check_family(req.base, base, experts)
    for m in (base, *experts):
        m.check_files(cat)
    fill_fallback_trims(cat, plan)  # experts without statistics, for ties and breadcrumbs
    selected = _select_blocks(plan, base, experts)
    planned = _planned_bytes(selected, experts)
    total = sum(planned.values())
    if total > plan.budget_bytes:
        raise BudgetViolation(f"plan {plan.plan_hash[:12]} needs {total} expert bytes, over its "
                              f"budget of {plan.budget_bytes}")
    ckpt = open_checkpoint(base.path)
    on_disk = {absolute(h.path) for h in ckpt.files}
    if on_disk != {absolute(f.path) for f in base.files.values()}:
        raise SourceChanged(f"model {base.name!r}: the files at {base.path} are not the ones "
                            f"ingested; re-ingest {base.name!r}")
    return Prepared(plan, base, experts, ckpt, selected, planned, req.output_dtype,
                    inputs.promoted)


def _check_family(ref: str, base: ModelSource, experts: list[ModelSource]) -> None:
    """The base (`ref` in the request) is a full base model and every expert derives from it."""
    if base.base is not None or base.kind != "full":
        raise InvalidRequest(f"model {ref!r} is not a base model (kind {base.kind}, base "
                             f"{base.base!r})", field="base")
    for e in experts:
        if e.base != base.name:
            raise InvalidRequest(f"expert {e.name!r} has base {e.base!r}, not {base.name!r}",
                                 field="experts")


def _select_blocks(plan: Plan, base: ModelSource, experts: list[ModelSource]
                   ) -> dict[tuple[int, str], list[BlockRow]]:
    """Each planned block's catalog row by (expert position, tensor); SourceChanged if gone."""
    position = {e.name: i for i, e in enumerate(experts)}
    selected: dict[tuple[int, str], list[BlockRow]] = {}
    for pb in plan.blocks:
        i = position.get(pb.model)
        if i is None:
            raise InvalidRequest(f"plan reads model {pb.model!r}, which is not an expert of the "
                                 "request", field="plan")
        blk = experts[i].blocks.get((pb.tensor, pb.block_index))
        bblk = base.blocks.get((pb.tensor, pb.block_index))
        if blk is None or bblk is None:
            raise SourceChanged(f"model {pb.model!r}: tensor {pb.tensor!r} block "
                                f"{pb.block_index} of the plan is not in the catalog; the model "
                                "was re-ingested since planning: plan again")
        if blk.nbytes != pb.nbytes:
            raise SourceChanged(f"model {pb.model!r}: tensor {pb.tensor!r} block "
                                f"{pb.block_index} is {blk.nbytes} bytes in the catalog, "
                                f"{pb.nbytes} in the plan; re-ingested since planning: plan again")
        if (blk.row_start, blk.row_end) != (bblk.row_start, bblk.row_end):
            raise InvalidCheckpoint(f"model {pb.model!r}: tensor {pb.tensor!r} block "
                                    f"{pb.block_index} covers rows {blk.row_start}..{blk.row_end}"
                                    f", the base's block {bblk.row_start}..{bblk.row_end}")
        selected.setdefault((i, pb.tensor), []).append(blk)
    for (i, tensor), blks in selected.items():
        blks.sort(key=lambda b: b.block_index)
        if len({b.block_index for b in blks}) != len(blks):
            raise InvalidRequest(f"plan lists a block of {experts[i].name!r} tensor {tensor!r} "
                                 "twice", field="plan")
    return selected


def _planned_bytes(selected: dict[tuple[int, str], list[BlockRow]],
                   experts: list[ModelSource]) -> dict[str, int]:
    """Expert bytes the selection reads, by expert (a LoRA tensor's lora_A included)."""
    planned = {e.name: 0 for e in experts}
    for (i, tensor), blks in selected.items():
        planned[experts[i].name] += sum(b.nbytes for b in blks)
        if experts[i].kind == "lora":
            lora_a = experts[i].tensors[tensor].lora_a
            if lora_a is None:
                raise InvalidCheckpoint(f"LoRA model {experts[i].name!r}: tensor {tensor!r} has "
                                        "no lora_A in the catalog; re-ingest it")
            planned[experts[i].name] += lora_a.nbytes
    return planned


def output_layout(prep: Prepared) -> list[tuple[str, list[tuple[str, str, tuple[int, ...]]]]]:
    """Output files named like the base's, each with its tensors in checkpoint order."""
    by_file: dict[int, list[TensorRow]] = {}
    for t in prep.base.tensors.values():
        by_file.setdefault(t.file_index, []).append(t)
    out = []
    for index in sorted(by_file):
        name = basename(prep.base.file_path(index))
        tensors = sorted(by_file[index], key=lambda t: t.ordinal)
        out.append((name, [(t.name, prep.out_dtype or t.dtype, t.shape) for t in tensors]))
    return out
