"""Stream a checkpoint's blocks through worker threads: content hashes, delta stats, trim thresholds."""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from mergepipe.catalog.col_groups import block_col_sq, zero_col_sq
from mergepipe.catalog.stats import (
    BlockStats,
    Histogram,
    NonFiniteDelta,
    Scratch,
    TrimThresholds,
    scan_block,
)
from mergepipe.core import delta_kernels
from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.torch_threads import pin_torch_threads
from mergepipe.core.vocab import DTYPE_SIZES
from mergepipe.storage.grid import is_element_grid
from mergepipe.storage.lora import lora_delta
from mergepipe.storage.safetensors_format import TensorEntry, decode_array_into, to_float32
from mergepipe.storage.storage import RangeReader, open_reader
from mergepipe.storage.store_types import Stamp

if TYPE_CHECKING:
    import torch  # LoRA's lora_A only: a scan of full or delta checkpoints never imports it

SORT_BELOW = 1 << 16  # one-block tensors this small get their thresholds by sorting
# Exponent bits that mark Inf / NaN, per dtype (checked on raw bytes when no delta is computed).
_NONFINITE: dict[str, tuple[type[np.integer], int]] = {
    "BF16": (np.int16, 0x7F80), "F16": (np.int16, 0x7C00), "F32": (np.int32, 0x7F800000)}


@dataclass(frozen=True)
class Span:
    """A byte range of a file."""

    path: str
    offset: int
    nbytes: int


@dataclass
class TensorPlan:
    """One tensor to scan: its own bytes on the base's row grid, and how to get its delta.

    mode: "hash" (content hashes only), "full" (delta = own - base), "delta" (own bytes are the
    delta) or "lora" (own bytes are lora_B; delta = lora_delta(B rows, lora_a, lora_scale)).
    """

    name: str
    mode: str
    entry: TensorEntry
    rows: Sequence[tuple[int, int]]  # a closed-form BlockGrid, or the catalog's rows
    base: TensorEntry | None = None  # full: the base tensor (same shape, any float dtype)
    base_hashes: list[str] | None = None  # full: the base blocks' content hashes (same grid)
    lora_a: Span | None = None
    lora_a_dtype: str | None = None
    lora_a_shape: tuple[int, ...] | None = None
    lora_scale: float | None = None
    value_norm: bool = False  # "hash" of a base: also the L2 norm of the tensor's values
    # the tensor as the catalog records it, when `entry` is a view of its first rows (an
    # expert's vocabulary tensor with more rows than its base's: the rows they share)
    recorded: TensorEntry | None = None

    def span(self, i: int) -> Span:
        return self._span(self.entry, i)

    def base_span(self, i: int) -> Span:
        assert self.base is not None
        return self._span(self.base, i)

    def _span(self, entry: TensorEntry, i: int) -> Span:
        """Block i of `entry`: its grid units (rows, or elements) times the bytes of a unit."""
        start, end = self.rows[i]
        units = self.rows[-1][1]
        ub = entry.nbytes // units if units else 0
        return Span(entry.file, entry.data_offset + start * ub, (end - start) * ub)


@dataclass
class TensorResult:
    """What a scan found for one tensor."""

    name: str
    hashes: list[str]
    stats: list[BlockStats] | None
    trim: TrimThresholds | None
    lora_a_hash: str | None = None  # LoRA: xxh3-128 of lora_A's raw bytes
    value_l2: float | None = None  # a base's tensor (plan.value_norm): L2 norm of its values


@dataclass
class TensorState:
    """A tensor being scanned: what its blocks gave so far."""

    plan: TensorPlan
    index: int
    hashes: list[str] = field(default_factory=list)
    stats: list[BlockStats] = field(default_factory=list)
    trim: TrimThresholds | None = None
    remaining: int = 0
    cached: np.ndarray | None = None  # |delta| of a one-block tensor, for the refinement
    lora_a: torch.Tensor | None = None
    lora_a_hash: str | None = None
    value_sumsq: float = 0.0  # plan.value_norm: the sum of squares of the values so far


def new_state(plan: TensorPlan, index: int) -> TensorState:
    """A tensor's state before its first block (no statistics for a hash-only scan)."""
    n = len(plan.rows)
    st = TensorState(plan, index, [""] * n, remaining=n)
    if plan.mode != "hash":
        st.stats = [BlockStats(0.0, 0.0, 0.0, 0)] * n
        numel = plan.entry.numel
        if plan.mode == "lora":
            assert plan.lora_a_shape is not None
            numel = plan.entry.shape[0] * plan.lora_a_shape[1]
        st.trim = TrimThresholds(numel)
    return st


def add_scan(st: TensorState, i: int, out: BlockScan) -> None:
    """Take one block's first-pass result into its tensor's state."""
    h, stats, (counts, mixed), cached = out
    st.hashes[i] = h
    if st.trim is None and stats is not None:  # a base block: l2 of its values
        st.value_sumsq += stats.l2 * stats.l2
    if st.trim is not None:
        assert stats is not None and counts is not None
        st.stats[i] = stats
        st.trim.add(counts)
        st.trim.add_mixed(mixed)
        st.cached = cached


def close_level(st: TensorState) -> None:
    """Finish the level just fed; a cached one-block tensor resolves every level in memory."""
    assert st.trim is not None
    if st.cached is not None and st.cached.size <= SORT_BELOW:
        st.trim.solve_sorted(st.cached)
    st.trim.finish_level()
    while st.trim.pending and st.cached is not None:
        st.trim.add(st.trim.block_counts(st.cached.view(np.int32), _buffers.scratch))
        st.trim.finish_level()


class _Buffers(threading.local):
    """One worker thread's raw read buffers and array scratch, reused block after block."""

    def __init__(self) -> None:
        self.raw: dict[str, bytearray] = {}
        self.scratch = Scratch()

    def read(self, reader: RangeReader, name: str, span: Span) -> memoryview:
        buf = self.raw.get(name)
        if buf is None or len(buf) < span.nbytes:
            buf = self.raw[name] = bytearray(span.nbytes)
        view = memoryview(buf)[:span.nbytes]
        reader.read_into(span.path, span.offset, view)
        return view


_buffers = _Buffers()


# What the first pass finds in one block: content hash, delta stats, (level-0 histogram, mixed
# entries' bits), and the |delta| itself for a one-block tensor (for the threshold refinement).
BlockScan = tuple[str, BlockStats | None, tuple[Histogram | None, np.ndarray | None],
                  np.ndarray | None]


def scan_own_block(st: TensorState, i: int, reader: RangeReader) -> BlockScan:
    plan = st.plan
    raw = _buffers.read(reader, "own", plan.span(i))
    digest = xxhash.xxh3_128_hexdigest(raw)
    if plan.mode == "hash":
        if has_nonfinite(raw, plan.entry.dtype):
            raise InvalidCheckpoint(f"{_where(plan, i)}: NaN or Inf in the weights")
        return digest, _value_l2(plan, raw), (None, None), None
    assert st.trim is not None
    return _scan_delta_block(st, i, raw, digest, reader, None, st.trim.collecting_mixed)


def _value_l2(plan: TensorPlan, raw: memoryview) -> BlockStats | None:
    """A base block's values' L2 norm (only l2 set), for the relative delta norm of its
    experts; None unless the plan asks for it."""
    if not plan.value_norm or not len(raw):
        return None
    n = len(raw) // DTYPE_SIZES[plan.entry.dtype]
    x = decode_array_into(raw, plan.entry.dtype, _buffers.scratch.get("x", n, np.float32))
    with np.errstate(over="ignore"):
        sq = float(np.dot(x, x))  # float32 BLAS: ample for a ratio's denominator
    if math.isinf(sq):  # values near float32's limit: their squares need float64
        y = x.astype(np.float64)
        sq = float(np.dot(y, y))
    return BlockStats(math.sqrt(sq), 0.0, 0.0, 0)


def scan_full_block(plan: TensorPlan, i: int, raw: memoryview, base_raw: memoryview,
                    digest: str | None = None) -> BlockScan:
    """The first pass over block i of a "full" plan from bytes already in memory (the
    executor's output block and its base block): exactly what scanning the files computes.

    `digest`: the xxh3-128 of `raw` when the caller knows it. Raises NonFiniteDelta.
    """
    assert plan.mode == "full"
    st = TensorState(plan, -1)
    return _scan_delta_block(st, i, raw, digest or xxhash.xxh3_128_hexdigest(raw), None,
                             base_raw, True)


def _scan_delta_block(st: TensorState, i: int, raw: memoryview, digest: str,
                      reader: RangeReader | None, base_raw: memoryview | None,
                      collect_mixed: bool) -> BlockScan:
    plan = st.plan
    if _same_as_base(plan, i, digest):  # an untouched block: its delta is exactly zero
        return untouched_scan(plan, i, digest)
    a = _abs_delta(st, i, raw, reader, base_raw)
    try:
        stats, counts, mixed = scan_block(a, _buffers.scratch, collect_mixed=collect_mixed)
    except NonFiniteDelta as e:
        if reader is None:
            raise
        raise InvalidCheckpoint(f"{_where(plan, i)}: {_nonfinite_cause(plan, raw, str(e))}"
                                ) from None
    col_sq = block_col_sq(a, plan.entry.shape, _first_element(plan, i))
    if col_sq is not None:
        stats = replace(stats, col_sq=col_sq)
    return digest, stats, (counts, mixed), a.copy() if len(plan.rows) == 1 else None


def _first_element(plan: TensorPlan, i: int) -> int:
    """The flat index of block i's first element (its grid unit is a row or an element)."""
    start, units = plan.rows[i][0], plan.rows[-1][1]
    shape = plan.entry.shape
    if is_element_grid(shape, units) or len(shape) < 2:
        return start
    return start * (plan.entry.numel // shape[0] if shape[0] else 0)


def untouched_scan(plan: TensorPlan, i: int, digest: str) -> BlockScan:
    """The first pass over block i of a "full" plan holding the base's very bytes (content
    hash `digest`): a zero delta, known without reading the block."""
    n = plan.span(i).nbytes // DTYPE_SIZES[plan.entry.dtype]
    zero = (np.zeros(1, dtype=np.int64), np.full(1, n, dtype=np.int64))
    return (digest, BlockStats(0.0, 0.0, 0.0, 0, zero_col_sq(plan.entry.shape)), (zero, None),
            np.zeros(n, dtype=np.float32) if len(plan.rows) == 1 else None)


def _same_as_base(plan: TensorPlan, i: int, digest: str) -> bool:
    """Whether block i holds the base's very bytes (same dtype and xxh3-128 content hash)."""
    return (plan.mode == "full" and plan.base_hashes is not None and plan.base is not None
            and plan.base.dtype == plan.entry.dtype and plan.base_hashes[i] == digest)


def refine_block(st: TensorState, i: int, reader: RangeReader) -> Histogram:
    assert st.trim is not None
    if _same_as_base(st.plan, i, st.hashes[i]):  # n zeros: n times the counts of one zero
        one = st.trim.block_counts(np.zeros(1, dtype=np.int32))
        assert isinstance(one, tuple)
        return one[0], one[1] * (st.plan.span(i).nbytes // DTYPE_SIZES[st.plan.entry.dtype])
    a = _abs_delta(st, i, _buffers.read(reader, "own", st.plan.span(i)), reader)
    return st.trim.block_counts(a.view(np.int32), _buffers.scratch)


def _abs_delta(st: TensorState, i: int, raw: memoryview, reader: RangeReader | None,
               base_raw: memoryview | None = None) -> np.ndarray:
    """|delta| of block i as a flat float32 array (a thread-local buffer: use it or copy it).

    A full plan's base block is `base_raw` when given, else read with `reader`."""
    plan = st.plan
    n = len(raw) // DTYPE_SIZES[plan.entry.dtype]
    x = _buffers.scratch.get("x", n, np.float32)
    if plan.mode == "full" and base_raw is None:
        assert reader is not None
        base_raw = _buffers.read(reader, "base", plan.base_span(i))
    base_dtype = plan.base.dtype if plan.base is not None else "F32"
    if delta_kernels.available() and plan.mode in ("full", "delta") and n:  # one C pass
        return delta_kernels.abs_delta_into(x, raw, plan.entry.dtype,
                                            base_raw if plan.mode == "full" else None, base_dtype)
    x = decode_array_into(raw, plan.entry.dtype, x)
    if plan.mode == "full":
        assert base_raw is not None
        np.subtract(x, decode_array_into(base_raw, base_dtype,
                                         _buffers.scratch.get("y", n, np.float32)), out=x)
    elif plan.mode == "lora":
        x = _lora_delta(st, i, x)
    return np.abs(x, out=x)


def _lora_delta(st: TensorState, i: int, b_rows: np.ndarray) -> np.ndarray:
    """The float32 delta of block i of a LoRA plan from its lora_B rows: torch's product, so
    that it is bit-identical with the executor's (LoRA is the one scan that imports torch)."""
    import torch

    plan = st.plan
    assert st.lora_a is not None and plan.lora_scale is not None
    start, end = plan.rows[i]
    b = torch.from_numpy(b_rows).view(end - start, -1)
    return lora_delta(b, st.lora_a, plan.lora_scale).numpy().reshape(-1)


def read_lora_a(plan: TensorPlan, reader: RangeReader) -> tuple[torch.Tensor | None, str]:
    """lora_A of a LoRA plan: (its float32 matrix, or None for a hash-only scan; xxh3-128 of
    its raw bytes, which the executor checks when it reads lora_A)."""
    assert plan.lora_a is not None and plan.lora_a_dtype is not None
    s = plan.lora_a
    raw = reader.read(s.path, s.offset, s.nbytes)
    digest = xxhash.xxh3_128_hexdigest(raw)
    if plan.mode != "lora":
        return None, digest
    if has_nonfinite(raw, plan.lora_a_dtype):
        raise InvalidCheckpoint(f"{s.path}: tensor {plan.name!r}: NaN or Inf in lora_A")
    return to_float32(raw, plan.lora_a_dtype, plan.lora_a_shape), digest


def has_nonfinite(raw: bytearray | memoryview, dtype: str) -> bool:
    """Whether raw little-endian floats of `dtype` hold a NaN or an Inf (exponent all ones)."""
    if len(raw) == 0:
        return False
    int_dtype, mask = _NONFINITE[dtype]
    t = np.frombuffer(raw, dtype=int_dtype)
    exponents = np.bitwise_and(t, mask, out=_buffers.scratch.get("exp", t.size, int_dtype))
    return int(exponents.max()) == mask


def _where(plan: TensorPlan, i: int) -> str:
    start, end = plan.rows[i]
    unit = "elements" if is_element_grid(plan.entry.shape, plan.rows[-1][1]) else "rows"
    return f"{plan.entry.file}: tensor {plan.name!r} block {i} ({unit} {start}..{end})"


def _nonfinite_cause(plan: TensorPlan, raw: memoryview, what: str) -> str:
    if has_nonfinite(raw, plan.entry.dtype):
        part = "lora_B" if plan.mode == "lora" else "weights"
        return f"NaN or Inf in the {part}"
    if plan.mode == "full":
        return f"the delta against the base is {what} (float32 overflow)"
    return f"the delta is {what} (float32 overflow)"


# -- the scan of a checkpoint ----------------------------------------------------------------------
INLINE_BELOW = 8 << 20  # scans of fewer bytes run in the calling thread

Task = tuple[TensorState, int, bool]  # (tensor, block index, is a refinement pass)


class FirstPass:
    """The first pass over one "full" tensor, fed block by block from outside (the executor
    computes `scan_full_block` of each output block while it writes); `scan_tensors(resume=)`
    takes its rows. Memory: one threshold histogram while open, only the results once closed.
    A tensor whose thresholds level 0 cannot resolve (more mixed entries than kept, e.g. a
    float32 output) is discarded when it closes and scanned from the file as before."""

    def __init__(self, plan: TensorPlan) -> None:
        assert plan.mode == "full"
        self.state = new_state(plan, -1)

    def add(self, i: int, out: BlockScan) -> None:
        """Block i's result (any order, each block once); closes level 0 after the last."""
        if self.state.remaining <= 0:
            return
        add_scan(self.state, i, out)
        self.state.remaining -= 1
        if self.state.remaining == 0:
            close_level(self.state)
            self.state.cached = None
            assert self.state.trim is not None
            if self.state.trim.pending:  # kept, its refinement state would grow with the
                self.discard()           # model: the file scan redoes this tensor instead
            else:
                self.state.trim.release()

    def discard(self) -> None:
        """Give up on this tensor (a non-finite delta, thresholds that need refinement passes):
        the scan of the files redoes it."""
        self.state.remaining = -1
        self.state.trim = self.state.cached = None
        self.state.stats = []

    @property
    def complete(self) -> bool:
        return self.state.remaining == 0

    def matches(self, plan: TensorPlan) -> bool:
        """Whether this pass was over the same tensor, dtype, grid and base as `plan`."""
        p = self.state.plan
        return (self.complete and plan.mode == "full" and plan.name == p.name
                and plan.entry.dtype == p.entry.dtype and plan.entry.shape == p.entry.shape
                and plan.rows == p.rows and plan.base_hashes == p.base_hashes
                and plan.base is not None and p.base is not None
                and plan.base.dtype == p.base.dtype)


def default_workers() -> int:
    """Threads of a scan (and of a merge's compute): the CPUs, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def scan_tensors(plans: list[TensorPlan], reader: RangeReader, *,
                 progress: ProgressFn | None = None,
                 workers: int | None = None,
                 resume: Mapping[str, FirstPass] | None = None) -> list[TensorResult]:
    """Scan every block of every plan (in order, `workers` blocks at a time); results per plan.

    `resume`: first passes already made of some tensors (by name; used where `matches` the
    plan): only their remaining threshold refinement passes read the files.
    Memory: about (2 x workers) blocks in flight plus one threshold histogram per open tensor.
    """
    return _Scan(plans, reader, progress, workers or default_workers(), resume or {}).run()


def scan_pinned(plans: list[TensorPlan], pins: list[tuple[str, Stamp]],
                progress: ProgressFn | None, *, resume: Mapping[str, FirstPass] | None = None,
                workers: int | None = None) -> tuple[list[TensorResult], int]:
    """`scan_tensors` with a reader of its own: (a result per plan, bytes read). `pins`: the
    checkpoint's files at the versions to read (a remote object is read at that one only)."""
    with open_reader() as reader:
        for path, stamp in pins:
            reader.pin(path, stamp)
        results = scan_tensors(plans, reader, progress=progress, workers=workers, resume=resume)
        return results, reader.bytes_read


class _Scan:
    """The first pass over every block in order, then each tensor's refinement passes, with
    at most 2 x workers blocks in flight."""

    def __init__(self, plans: list[TensorPlan], reader: RangeReader, progress: ProgressFn | None,
                 workers: int, resume: Mapping[str, FirstPass]) -> None:
        self.plans, self.reader, self.progress, self.workers = plans, reader, progress, workers
        self.resumed = {k: r.state for k, p in enumerate(plans)
                        if (r := resume.get(p.name)) is not None and r.matches(p)}
        # the blocks tile each tensor: their bytes in all are the tensor's (closed form); a
        # resumed tensor is read again only for its refinement passes
        self.total = sum(p.entry.nbytes for k, p in enumerate(plans)
                         if (st := self.resumed.get(k)) is None or st.trim is None
                         or st.trim.pending)
        self.done = 0
        self.results: list[TensorResult | None] = [None] * len(plans)
        self.refine: deque[Task] = deque()
        self.source = self._first_pass()

    def run(self) -> list[TensorResult]:
        pin_torch_threads(load=any(p.mode == "lora" for p in self.plans))
        inflight: deque[tuple[Future[Any], Task]] = deque()
        pool: ThreadPoolExecutor | _Inline = (ThreadPoolExecutor(self.workers, "mergepipe-scan")
                                              if self.total >= INLINE_BELOW else _Inline())
        with pool:
            try:
                while True:
                    while len(inflight) < 2 * self.workers and (task := self._next()) is not None:
                        st, i, is_refine = task
                        fn = refine_block if is_refine else scan_own_block
                        inflight.append((pool.submit(fn, st, i, self.reader), task))
                    if not inflight:
                        break
                    fut, task = inflight.popleft()
                    self._take(task, fut.result())
            finally:
                for fut, _ in inflight:
                    fut.cancel()
        assert all(r is not None for r in self.results)
        return [r for r in self.results if r is not None]

    def _first_pass(self) -> Iterator[Task]:
        for k, plan in enumerate(self.plans):
            if k in self.resumed:
                st = self.resumed[k]
                st.plan, st.index = plan, k
                self._schedule_refine(st)
                continue
            st = new_state(plan, k)
            if plan.lora_a is not None:  # a LoRA tensor, with or without statistics
                st.lora_a, st.lora_a_hash = read_lora_a(plan, self.reader)
            for i in range(len(plan.rows)):
                yield st, i, False

    def _next(self) -> Task | None:
        if not self.refine:
            task = next(self.source, None)
            if task is not None or not self.refine:  # a resumed last tensor may just have queued some
                return task
        return self.refine.popleft()

    def _take(self, task: Task, out: Any) -> None:
        st, i, is_refine = task
        st.remaining -= 1
        if is_refine:
            assert st.trim is not None
            st.trim.add(out)
        else:
            add_scan(st, i, out)
            self.done += st.plan.span(i).nbytes
            if self.progress is not None:
                self.progress(Progress(self.done, self.total, "bytes"))
        if st.remaining == 0:
            if st.trim is None:
                self._finish(st)
            else:
                close_level(st)
                self._schedule_refine(st)

    def _schedule_refine(self, st: TensorState) -> None:
        assert st.trim is not None
        if st.trim.pending:
            st.remaining = len(st.plan.rows)
            self.refine.extend((st, i, True) for i in range(len(st.plan.rows)))
        else:
            self._finish(st)

    def _finish(self, st: TensorState) -> None:
        if st.trim is not None:
            st.trim.release()
        self.results[st.index] = TensorResult(
            st.plan.name, st.hashes, st.stats if st.trim is not None else None, st.trim,
            st.lora_a_hash, math.sqrt(st.value_sumsq) if st.plan.value_norm else None)
        st.cached = st.lora_a = None


class _Inline:
    """Runs each task at submit, in the calling thread (small scans: no thread hand-offs)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(e)
        return fut

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
