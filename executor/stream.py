"""The block loop: stream the base in checkpoint order, read the planned expert blocks, merge, write."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from catalog.checkpoint import INDEX_FILE, Checkpoint, open_checkpoint
from catalog.safetensors_format import TORCH_DTYPES
from catalog.storage import LocalFileReader
from executor.reads import BudgetCounter, Prefetcher, Range
from executor.sources import BlockInfo, ModelSource, TensorInfo, load_model
from executor.writer import (
    BackgroundWrites,
    CheckpointWriter,
    OutputTensor,
    copy_extra_files,
    encode,
)
from mergepipe.errors import BudgetViolation, InvalidCheckpoint, InvalidRequest, SourceChanged
from mergepipe.request import MergeRequest

# One intra-op thread: block-sized elementwise ops are ~10x faster than with torch's pool
# here (its threads spin against our read threads); reads give the parallelism instead.
COMPUTE_THREADS = 1
# Block-sized buffers come from the heap and are reused, not fresh mmaps that fault in every
# page of every block (2-3 ms per MiB-sized tensor on a VM).
MALLOC_MMAP_THRESHOLD = 64 << 20
MALLOC_TRIM_THRESHOLD = 128 << 20
CHUNK_BYTES = 4 << 20  # bytes (base + expert) read per prefetch step
PREFETCH_DEPTH = 2  # chunks read ahead of the one being computed
PROGRESS_EVERY_S = 0.5


class PlannedBlockLike(Protocol):
    """One block of the access set (planner.plan.PlannedBlock)."""

    @property
    def model(self) -> str: ...
    @property
    def tensor(self) -> str: ...
    @property
    def block_index(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


class PlanLike(Protocol):
    """What the executor needs of a plan (planner.plan.Plan, or a stored plan for replay)."""

    @property
    def request(self) -> MergeRequest: ...
    @property
    def plan_hash(self) -> str: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def blocks(self) -> Sequence[PlannedBlockLike]: ...

    @property
    def trims(self) -> Mapping[tuple[str, str], Any]: ...


@dataclass
class Prepared:
    """A plan checked against the catalog and the files on disk, ready to execute."""

    plan: PlanLike
    base: ModelSource
    experts: list[ModelSource]
    checkpoint: Checkpoint
    selected: dict[tuple[int, str], list[BlockInfo]]  # (expert position, tensor) -> blocks
    planned_by_model: dict[str, int]
    out_dtype: str | None  # None: each tensor keeps the base's dtype

    @property
    def planned_bytes(self) -> int:
        return sum(self.planned_by_model.values())


@dataclass
class ExecutionResult:
    """What one execution read and wrote."""

    tensors: list[OutputTensor]
    output_hash: str
    expert_bytes_read: int
    expert_bytes_by_model: dict[str, int]
    base_bytes_read: int
    blocks_total: int
    expert_blocks_read: int
    exec_seconds: float
    extra_files: list[str] = field(default_factory=list)


def prepare(cat: Any, plan: PlanLike) -> Prepared:
    """Load the inputs, check the files are unchanged and the plan fits the budget."""
    req = plan.request
    base = load_model(cat, req.base)
    if base.base is not None or base.kind != "full":
        raise InvalidRequest(f"model {req.base!r} is not a base model (kind {base.kind}, base "
                             f"{base.base!r})", field="base")
    experts = [load_model(cat, e.model) for e in req.experts]
    for e in experts:
        if e.base != base.name:
            raise InvalidRequest(f"expert {e.name!r} has base {e.base!r}, not {base.name!r}",
                                 field="experts")
    for m in (base, *experts):
        m.check_files()
    position = {e.name: i for i, e in enumerate(experts)}
    selected: dict[tuple[int, str], list[BlockInfo]] = {}
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
    planned = {e.name: 0 for e in experts}
    for (i, tensor), blks in selected.items():
        blks.sort(key=lambda b: b.block_index)
        if len({b.block_index for b in blks}) != len(blks):
            raise InvalidRequest(f"plan lists a block of {experts[i].name!r} tensor {tensor!r} "
                                 "twice", field="plan")
        planned[experts[i].name] += sum(b.nbytes for b in blks)
        if experts[i].kind == "lora":
            lora_a = experts[i].tensors[tensor].lora_a
            if lora_a is None:
                raise InvalidCheckpoint(f"LoRA model {experts[i].name!r}: tensor {tensor!r} has "
                                        "no lora_A in the catalog; re-ingest it")
            planned[experts[i].name] += lora_a.nbytes
    total = sum(planned.values())
    if total > plan.budget_bytes:
        raise BudgetViolation(f"plan {plan.plan_hash[:12]} needs {total} expert bytes, over its "
                              f"budget of {plan.budget_bytes}")
    ckpt = open_checkpoint(base.path)
    on_disk = {os.path.abspath(h.path) for h in ckpt.files}
    if on_disk != {os.path.abspath(f.path) for f in base.files.values()}:
        raise SourceChanged(f"model {base.name!r}: the files at {base.path} are not the ones "
                            f"ingested; re-ingest {base.name!r}")
    return Prepared(plan, base, experts, ckpt, selected, planned, req.output_dtype)


def output_layout(prep: Prepared) -> list[tuple[str, list[tuple[str, str, tuple[int, ...]]]]]:
    """Output files named like the base's, each with its tensors in checkpoint order."""
    by_file: dict[int, list[TensorInfo]] = {}
    for t in prep.base.tensors.values():
        by_file.setdefault(t.file_index, []).append(t)
    out = []
    for index in sorted(by_file):
        name = os.path.basename(prep.base.file_path(index))
        tensors = sorted(by_file[index], key=lambda t: t.ordinal)
        out.append((name, [(t.name, prep.out_dtype or t.dtype, t.shape) for t in tensors]))
    return out


def execute(prep: Prepared, out_dir: Path, *, threads: int | None = None,
            progress: Callable[[dict[str, Any]], None] | None = None,
            chunk_bytes: int = CHUNK_BYTES, compute_threads: int | None = None
            ) -> ExecutionResult:
    """Write the merged checkpoint into `out_dir` (an existing empty directory).

    Reads run `PREFETCH_DEPTH` chunks ahead in `threads` threads, chunks are merged in
    `compute_threads` threads (one torch thread each), writes go out in order in one more.
    """
    t0 = time.perf_counter()
    steps, chunks = _schedule(prep, chunk_bytes)
    writer = CheckpointWriter(
        Path(out_dir), output_layout(prep),
        metadata={os.path.basename(h.path): h.metadata for h in prep.checkpoint.files},
        write_index=os.path.isdir(prep.base.path) and os.path.exists(
            os.path.join(prep.base.path, INDEX_FILE)))
    expert_reader, base_reader = LocalFileReader(), LocalFileReader()
    merger = _ChunkMerger(prep)
    n_compute = compute_threads or default_compute_threads()
    done = 0
    blocks_total = sum(map(len, steps))
    last_report = time.monotonic()
    _reuse_freed_buffers()
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(COMPUTE_THREADS)
    writes = BackgroundWrites(writer)
    compute = ThreadPoolExecutor(max_workers=n_compute, thread_name_prefix="mergepipe-merge")
    inflight: deque[tuple[int, Future[list[tuple[str, int, memoryview]]]]] = deque()

    def finish_oldest() -> None:
        nonlocal done, last_report
        ci, fut = inflight.popleft()
        for tensor, row_start, buf in fut.result():
            writes.write(tensor, row_start, buf)
        merger.release(steps[ci])
        done += len(steps[ci])
        if progress is not None and (time.monotonic() - last_report >= PROGRESS_EVERY_S
                                     or done == blocks_total):
            last_report = time.monotonic()
            progress({"blocks_done": done, "blocks_total": blocks_total,
                      "expert_bytes_read": expert_reader.bytes_read,
                      "base_bytes_read": base_reader.bytes_read})

    try:
        with Prefetcher(chunks, expert_reader=expert_reader, base_reader=base_reader,
                        budget=BudgetCounter(prep.plan.budget_bytes),
                        threads=threads or default_threads(), depth=PREFETCH_DEPTH) as pre:
            for ci, chunk_steps in enumerate(steps):
                data = pre.get(ci)
                merger.load_lora_a(data)
                inflight.append((ci, compute.submit(merger.merge_chunk, chunk_steps, data)))
                while len(inflight) > n_compute:
                    finish_oldest()
            while inflight:
                finish_oldest()
        writes.drain()
        tensors = writer.finish()
    except BaseException:
        compute.shutdown(wait=True, cancel_futures=True)
        writes.close()
        writer.abort()
        raise
    finally:
        compute.shutdown(wait=True)
        writes.close()
        torch.set_num_threads(torch_threads)
        expert_reader.close()
        base_reader.close()
    if expert_reader.bytes_read > prep.plan.budget_bytes:
        raise BudgetViolation(f"read {expert_reader.bytes_read} expert bytes, over the budget "
                              f"of {prep.plan.budget_bytes}")
    extra = copy_extra_files(prep.checkpoint.extra_files, Path(out_dir), prep.out_dtype)
    by_path = {f.path: e.name for e in prep.experts for f in e.files.values()}
    by_model = {e.name: 0 for e in prep.experts}
    for path, n in expert_reader.bytes_by_path.items():
        by_model[by_path[path]] += n
    return ExecutionResult(tensors, output_hash(tensors), expert_reader.bytes_read, by_model,
                           base_reader.bytes_read, done, merger.expert_blocks,
                           time.perf_counter() - t0, extra)


def _reuse_freed_buffers() -> None:
    """Tell glibc malloc to serve block-sized allocations from the heap (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MALLOC_MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, MALLOC_TRIM_THRESHOLD)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def default_compute_threads() -> int:
    """Merge threads: one per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def default_threads() -> int:
    """Read threads: I/O-bound, so a few more than the cores."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def output_hash(tensors: Sequence[OutputTensor]) -> str:
    """sha256 over the names, dtypes, shapes and content hashes of the output tensors."""
    canon = json.dumps([[t.name, t.dtype, list(t.shape), t.content_hash] for t in tensors],
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


@dataclass
class _Step:
    """One base block and the expert positions whose block is read for it."""

    tensor: str
    block_index: int
    row_start: int
    row_end: int
    experts: set[int]
    last_of_tensor: list[int]  # LoRA experts whose lora_A can be dropped after this block


class _ChunkMerger:
    """Turns the base and expert pieces of a chunk into output bytes (thread-safe per chunk)."""

    def __init__(self, prep: Prepared) -> None:
        from executor.operators import REGISTRY

        self.prep = prep
        self.req = prep.plan.request
        self.op = REGISTRY[self.req.operator]
        self.weights = tuple(self.req.weights())
        self.densities = self.req.densities()
        self.lora_a: dict[tuple[int, str], torch.Tensor] = {}
        self.keys: dict[tuple[int, str], int] = {}
        self.expert_blocks = 0

    def load_lora_a(self, data: Mapping[Hashable, memoryview]) -> None:
        """Decode the lora_A matrices read with this chunk (in the reading order)."""
        for key, raw in data.items():
            if isinstance(key, tuple) and key[0] == "a":
                _, i, tensor = key
                spec = self.prep.experts[i].tensors[tensor].lora_a
                assert spec is not None
                self.lora_a[(i, tensor)] = _decode(raw, spec.dtype, spec.shape)

    def release(self, chunk_steps: list[_Step]) -> None:
        """Drop what the finished chunk was the last to need; count its expert blocks."""
        for st in chunk_steps:
            self.expert_blocks += len(st.experts)
            for i in st.last_of_tensor:
                self.lora_a.pop((i, st.tensor), None)

    def merge_chunk(self, chunk_steps: list[_Step], data: Mapping[Hashable, memoryview]
                    ) -> list[tuple[str, int, memoryview]]:
        """(tensor, row_start, output bytes) of every step of the chunk, in order."""
        return [self.merge_step(st, data) for st in chunk_steps]

    def merge_step(self, st: _Step, data: Mapping[Hashable, memoryview]
                   ) -> tuple[str, int, memoryview]:
        from executor.operators import BlockContext, ExpertBlock
        from executor.operators.keyed_hash import expert_key

        t = self.prep.base.tensors[st.tensor]
        out_dtype = self.prep.out_dtype or t.dtype
        base_raw = data[("b", st.tensor, st.block_index)]
        if not st.experts and out_dtype == t.dtype:
            return st.tensor, st.row_start, base_raw  # nothing to add: the base's bytes
        b32 = _decode(base_raw, t.dtype, _block_shape(t.shape, st.row_start, st.row_end))
        if not st.experts:
            return st.tensor, st.row_start, encode(b32, out_dtype)
        blocks = []
        for i, spec in enumerate(self.req.experts):
            delta = None
            if i in st.experts:
                delta = _delta(self.prep.experts[i], i, st, b32, data, self.lora_a)
            key = self.keys.get((i, st.tensor))
            if key is None:
                key = self.keys[(i, st.tensor)] = expert_key(self.req.seed, spec.model,
                                                             st.tensor)
            blocks.append(ExpertBlock(
                index=i, model=spec.model, delta=delta, weight=spec.weight,
                density=self.densities[i],
                trim=self.prep.plan.trims.get((spec.model, st.tensor)), key=key))
        ctx = BlockContext(tensor=st.tensor, block_index=st.block_index,
                           flat_offset=st.row_start * t.row_numel, params=self.req.params,
                           n_experts=len(self.req.experts), all_weights=self.weights)
        return st.tensor, st.row_start, encode(self.op(b32, blocks, ctx), out_dtype)


def _schedule(prep: Prepared, chunk_bytes: int) -> tuple[list[list[_Step]], list[list[Range]]]:
    """Steps in checkpoint order grouped into chunks, with the byte ranges each chunk needs."""
    base = prep.base
    sel_index: dict[tuple[int, str], dict[int, BlockInfo]] = {
        k: {b.block_index: b for b in v} for k, v in prep.selected.items()}
    by_tensor: dict[str, list[int]] = {}
    for i, tensor in prep.selected:
        by_tensor.setdefault(tensor, []).append(i)
    steps: list[list[_Step]] = []
    chunks: list[list[Range]] = []
    cur_steps: list[_Step] = []
    cur_ranges: list[Range] = []
    cur_bytes = 0
    for t in base.tensors.values():
        positions = sorted(by_tensor.get(t.name, []))
        last = {i: max(sel_index[(i, t.name)]) for i in positions}
        first = {i: min(sel_index[(i, t.name)]) for i in positions}
        for bblk in base.tensor_blocks(t.name):
            bi = bblk.block_index
            ranges = [Range(("b", t.name, bi), base.file_path(bblk.file_index),
                            bblk.byte_offset, bblk.nbytes, False,
                            partial(base.verify_block, bblk))]
            readers = set()
            for i in positions:
                eblk = sel_index[(i, t.name)].get(bi)
                if eblk is None:
                    continue
                e = prep.experts[i]
                readers.add(i)
                ranges.append(Range(("e", i, t.name, bi), e.file_path(eblk.file_index),
                                    eblk.byte_offset, eblk.nbytes, True,
                                    partial(e.verify_block, eblk)))
                lora_a = e.tensors[t.name].lora_a
                if e.kind == "lora" and lora_a is not None and bi == first[i]:
                    ranges.append(Range(("a", i, t.name), e.file_path(lora_a.file_index),
                                        lora_a.offset, lora_a.nbytes, True))
            step = _Step(t.name, bi, bblk.row_start, bblk.row_end, readers,
                         [i for i in positions if last[i] == bi])
            cur_steps.append(step)
            cur_ranges.extend(ranges)
            cur_bytes += sum(r.nbytes for r in ranges)
            if cur_bytes >= chunk_bytes:
                steps.append(cur_steps)
                chunks.append(cur_ranges)
                cur_steps, cur_ranges, cur_bytes = [], [], 0
    if cur_steps:
        steps.append(cur_steps)
        chunks.append(cur_ranges)
    return steps, chunks


def _block_shape(shape: tuple[int, ...], row_start: int, row_end: int) -> tuple[int, ...]:
    return (row_end - row_start, *shape[1:]) if shape else ()


def _decode(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw bytes -> a float32 tensor of `shape` that owns its memory."""
    if raw.nbytes == 0:
        return torch.zeros(shape, dtype=torch.float32)
    t = torch.frombuffer(raw, dtype=TORCH_DTYPES[dtype])
    t = t.to(torch.float32) if dtype != "F32" else t.clone()
    return t.reshape(shape)


def _delta(e: ModelSource, i: int, st: _Step, b32: torch.Tensor,
           data: Mapping[Hashable, memoryview], lora_a: dict[tuple[int, str], torch.Tensor]
           ) -> torch.Tensor:
    """The float32 delta of expert `e` for this block, by the expert's storage kind."""
    info = e.tensors[st.tensor]
    raw = data[("e", i, st.tensor, st.block_index)]
    if e.kind == "full":
        if raw.nbytes == 0:
            return torch.zeros_like(b32)
        if info.dtype == "F32":
            return _decode(raw, info.dtype, tuple(b32.shape)).sub_(b32)
        # one pass: the half-precision values are widened inside the subtraction
        expert = torch.frombuffer(raw, dtype=TORCH_DTYPES[info.dtype]).reshape(b32.shape)
        return torch.sub(expert, b32)
    if e.kind == "delta":
        return _decode(raw, info.dtype, tuple(b32.shape))
    if e.kind == "lora":
        a = lora_a[(i, st.tensor)]
        rows = st.row_end - st.row_start
        b_rows = _decode(raw, info.dtype, (rows, info.shape[1]))
        d = torch.matmul(b_rows, a)
        if e.lora_scale is not None and e.lora_scale != 1.0:
            d.mul_(e.lora_scale)
        if tuple(d.shape) != tuple(b32.shape):
            raise InvalidCheckpoint(f"LoRA model {e.name!r}: tensor {st.tensor!r}: lora_B @ "
                                    f"lora_A is {list(d.shape)} for a base block of "
                                    f"{list(b32.shape)}")
        return d
    raise InvalidCheckpoint(f"model {e.name!r} has unknown kind {e.kind!r}")
