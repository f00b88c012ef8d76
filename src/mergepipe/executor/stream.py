"""The block loop: stream the base in checkpoint order, read the planned expert blocks, merge, write."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mergepipe.catalog.scan import FirstPass, default_workers
from mergepipe.core.errors import BudgetViolation
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.executor.blocks import ChunkMerger, MergedBlock
from mergepipe.executor.prepare import (
    Inputs,
    ModelSource,
    Prepared,
    output_layout,
    prepare,
    read_inputs,
)
from mergepipe.executor.schedule import BudgetCounter, Prefetcher, Step, schedule
from mergepipe.executor.side_files import copy_side_files
from mergepipe.executor.writer import BackgroundWrites, CheckpointWriter, OutputTensor
from mergepipe.storage.locations import basename
from mergepipe.storage.storage import RangeReader, open_reader

__all__ = ["ExecutionResult", "Inputs", "Prepared", "execute", "prepare", "read_inputs"]

# Block-sized buffers come from the heap and are reused, not fresh mmaps that fault in every
# page of every block (2-3 ms per MiB-sized tensor on a VM).
MALLOC_MMAP_THRESHOLD = 64 << 20
MALLOC_TRIM_THRESHOLD = 128 << 20
CHUNK_BYTES = 4 << 20  # bytes (base + expert) read per prefetch step
PREFETCH_DEPTH = 2  # chunks read ahead of the one being computed
PROGRESS_EVERY_S = 0.5


@dataclass
class ExecutionResult:
    """What one execution read and wrote."""

    tensors: list[OutputTensor]
    output_hash: str
    expert_bytes_read: int
    expert_bytes_by_model: dict[str, int]
    expert_fetch_by_model: dict[str, dict[str, int]]  # bytes, requests, retries per expert
    base_bytes_read: int
    blocks_total: int
    expert_blocks_read: int
    exec_seconds: float
    extra_files: list[str] = field(default_factory=list)  # side files copied from the base
    # the base's other files, left out: {"name", "reason"} each (executor.side_files)
    left_out_files: list[dict[str, str]] = field(default_factory=list)
    # first scan pass of each output tensor (execute(first_pass=True)), for its registration
    first_passes: dict[str, FirstPass] = field(default_factory=dict)
    kernel_copied_bytes: int = 0  # output bytes copied from the base by copy_file_range


def execute(prep: Prepared, out_dir: Path, *, threads: int | None = None,
            progress: ProgressFn | None = None,
            chunk_bytes: int | None = None, compute_threads: int | None = None,
            first_pass: bool = False,
            writer: CheckpointWriter | None = None) -> ExecutionResult:
    """Write the merged checkpoint into `out_dir` (an existing empty directory)."""
    t0 = time.perf_counter()
    steps, chunks = schedule(prep, chunk_bytes or CHUNK_BYTES)
    writer = writer or CheckpointWriter(
        Path(out_dir), output_layout(prep),
        metadata={basename(h.path): h.metadata for h in prep.checkpoint.files},
        write_index=prep.checkpoint.has_index)
    # Expert reads are scattered (a budgeted access set) and already large: no read-ahead.
    expert_reader, base_reader = open_reader(random_access=True), open_reader()
    _pin(expert_reader, prep.experts)
    _pin(base_reader, [prep.base])
    merger = ChunkMerger(prep, first_pass=first_pass)
    n_compute = compute_threads or default_workers()
    _reuse_freed_buffers()
    out = _Output(BackgroundWrites(writer), merger, sum(map(len, steps)), progress,
                  expert_reader, base_reader)
    compute = ThreadPoolExecutor(max_workers=n_compute, thread_name_prefix="mergepipe-merge")
    inflight: deque[tuple[list[Step], Future[list[MergedBlock]]]] = deque()
    try:
        with Prefetcher(chunks, expert_reader=expert_reader, base_reader=base_reader,
                        budget=BudgetCounter(prep.plan.budget_bytes),
                        threads=threads or default_threads(), depth=PREFETCH_DEPTH) as pre:
            for ci, chunk_steps in enumerate(steps):
                data = pre.get(ci)
                merger.load_lora_a(data)
                inflight.append((chunk_steps, compute.submit(merger.merge_chunk, chunk_steps,
                                                             data)))
                while len(inflight) > n_compute:
                    out.take(*inflight.popleft())
            while inflight:
                out.take(*inflight.popleft())
        out.writes.drain()
        tensors = writer.finish()
    except BaseException:
        compute.shutdown(wait=True, cancel_futures=True)
        out.writes.close()
        writer.abort()
        raise
    finally:
        compute.shutdown(wait=True)
        out.writes.close()
        expert_reader.close()
        base_reader.close()
    if expert_reader.bytes_read > prep.plan.budget_bytes:
        raise BudgetViolation(f"read {expert_reader.bytes_read} expert bytes, over the budget "
                              f"of {prep.plan.budget_bytes}")
    side = copy_side_files(prep.checkpoint.extra_files, Path(out_dir), prep.out_dtype)
    fetched = _fetch_by_model(prep, expert_reader)
    return ExecutionResult(tensors, output_hash(tensors), expert_reader.bytes_read,
                           {m: f["bytes"] for m, f in fetched.items()}, fetched,
                           base_reader.bytes_read,
                           out.done, merger.expert_blocks, time.perf_counter() - t0, side.copied,
                           side.left_out, out.passes, writer.kernel_copied)


class _Output:
    """Takes merged chunks in order: writes them, feeds the output's first scan pass, reports."""

    def __init__(self, writes: BackgroundWrites, merger: ChunkMerger, blocks_total: int,
                 progress: ProgressFn | None, expert_reader: RangeReader,
                 base_reader: RangeReader) -> None:
        self.writes, self.merger, self.blocks_total = writes, merger, blocks_total
        self.progress, self.readers = progress, (expert_reader, base_reader)
        self.passes: dict[str, FirstPass] = {}  # opened at a tensor's first block (histograms)
        self.done = 0
        self.last_report = time.monotonic()

    def take(self, chunk_steps: list[Step], fut: Future[list[MergedBlock]]) -> None:
        plans = self.merger.output_plans
        for st, (tensor, start, buf, scan) in zip(chunk_steps, fut.result(), strict=True):
            if st.copy_from is not None:  # a base tensor never read: copied, then verified
                b, base = st.copy_from, self.merger.prep.base
                self.writes.copy_tensor(tensor, base.file_path(b.file_index), b.byte_offset,
                                        b.content_hash, base.name)
            else:
                assert buf is not None
                self.writes.write(tensor, start, buf)
            if plans is not None:
                fp = self.passes.get(tensor)
                if fp is None:
                    fp = self.passes[tensor] = FirstPass(plans[tensor])
                if scan is None:
                    fp.discard()
                else:
                    fp.add(st.block_index, scan)
        self.merger.release(chunk_steps)
        self.done += len(chunk_steps)
        if self.progress is not None and (time.monotonic() - self.last_report >= PROGRESS_EVERY_S
                                          or self.done == self.blocks_total):
            self.last_report = time.monotonic()
            self.progress(Progress(self.done, self.blocks_total, "blocks",
                                   self.readers[0].bytes_read, self.readers[1].bytes_read))


def _pin(reader: RangeReader, models: Sequence[ModelSource]) -> None:
    """Remote files are read at the version ingested (their ETag / version id)."""
    for m in models:
        for f in m.files.values():
            reader.pin(f.path, f.stamp)


def _fetch_by_model(prep: Prepared, expert_reader: RangeReader) -> dict[str, dict[str, int]]:
    """Bytes fetched, requests and retries of each expert's reads."""
    by_path = {f.path: e.name for e in prep.experts for f in e.files.values()}
    by_model = {e.name: {"bytes": 0, "requests": 0, "retries": 0} for e in prep.experts}
    for path, st in expert_reader.fetch_stats().items():
        for k, v in st.to_dict().items():
            by_model[by_path[path]][k] += v
    return by_model


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


def default_threads() -> int:
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def output_hash(tensors: Sequence[OutputTensor]) -> str:
    """sha256 over the names, dtypes, shapes and content hashes of the output tensors."""
    canon = json.dumps([[t.name, t.dtype, list(t.shape), t.content_hash] for t in tensors],
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()
