"""Stream a checkpoint's blocks through worker threads: content hashes, delta stats, trim thresholds."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash
from mergepipe.catalog.lora import lora_delta
from mergepipe.catalog.safetensors_format import DTYPE_SIZES, TensorEntry, decode_into, to_float32
from mergepipe.catalog.stats import (
    BlockStats,
    Histogram,
    NonFiniteDelta,
    Scratch,
    TrimThresholds,
    scan_block,
)
from mergepipe.catalog.storage import LocalFileReader

from mergepipe.core.errors import InvalidCheckpoint

MODES = ("hash", "full", "delta", "lora")
INLINE_BELOW = 8 << 20  # scans of fewer bytes run in the calling thread
SORT_BELOW = 1 << 16  # one-block tensors this small get their thresholds by sorting
# Exponent bits that mark Inf / NaN, per dtype (checked on raw bytes when no delta is computed).
_NONFINITE = {"BF16": (torch.int16, 0x7F80), "F16": (torch.int16, 0x7C00),
              "F32": (torch.int32, 0x7F800000)}


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
    rows: list[tuple[int, int]]
    base: TensorEntry | None = None  # full: the base tensor (same shape, any float dtype)
    base_hashes: list[str] | None = None  # full: the base blocks' content hashes (same grid)
    lora_a: Span | None = None
    lora_a_dtype: str | None = None
    lora_a_shape: tuple[int, ...] | None = None
    lora_scale: float | None = None

    def span(self, i: int) -> Span:
        start, end = self.rows[i]
        rb = self.entry.row_bytes
        return Span(self.entry.file, self.entry.data_offset + start * rb, (end - start) * rb)

    def base_span(self, i: int) -> Span:
        assert self.base is not None
        start, end = self.rows[i]
        rb = self.base.row_bytes
        return Span(self.base.file, self.base.data_offset + start * rb, (end - start) * rb)


@dataclass
class TensorResult:
    """What a scan found for one tensor."""

    name: str
    hashes: list[str]
    stats: list[BlockStats] | None
    trim: TrimThresholds | None
    lora_a_hash: str | None = None  # LoRA: xxh3-128 of lora_A's raw bytes


@dataclass
class _State:
    plan: TensorPlan
    index: int
    hashes: list[str] = field(default_factory=list)
    stats: list[BlockStats] = field(default_factory=list)
    trim: TrimThresholds | None = None
    remaining: int = 0
    cached: torch.Tensor | None = None  # |delta| of a one-block tensor, for the refinement
    lora_a: torch.Tensor | None = None
    lora_a_hash: str | None = None


def _add_scan(st: _State, i: int, out: BlockScan) -> None:
    """Take one block's first-pass result into its tensor's state."""
    h, stats, (counts, mixed), cached = out
    st.hashes[i] = h
    if st.trim is not None:
        assert stats is not None and counts is not None
        st.stats[i] = stats
        st.trim.add(counts)
        st.trim.add_mixed(mixed)
        st.cached = cached


def _close_level(st: _State) -> None:
    """Finish the level just fed; a cached one-block tensor resolves every level in memory."""
    assert st.trim is not None
    if st.cached is not None and st.cached.numel() <= SORT_BELOW:
        st.trim.solve_sorted(st.cached)
    st.trim.finish_level()
    while st.trim.pending and st.cached is not None:
        st.trim.add(st.trim.block_counts(st.cached.view(torch.int32), _buffers.scratch))
        st.trim.finish_level()


def _to_read(resumed: _State | None) -> bool:
    """Whether a tensor's blocks are read: not resumed, or resumed with refinement to do."""
    return resumed is None or resumed.trim is None or resumed.trim.pending


class FirstPass:
    """The first pass over one "full" tensor, fed block by block from outside (the executor
    computes `scan_full_block` of each output block while it writes); `scan_tensors(resume=)`
    takes its rows. Memory: one threshold histogram while open, only the results once closed.
    A tensor whose thresholds level 0 cannot resolve (more mixed entries than kept, e.g. a
    float32 output) is discarded when it closes and scanned from the file as before."""

    def __init__(self, plan: TensorPlan) -> None:
        assert plan.mode == "full"
        n = len(plan.rows)
        self.state = _State(plan, -1, [""] * n, [BlockStats(0.0, 0.0, 0.0, 0)] * n,
                            TrimThresholds(plan.entry.numel), remaining=n)

    def add(self, i: int, out: BlockScan) -> None:
        """Block i's result (any order, each block once); closes level 0 after the last."""
        if self.state.remaining <= 0:
            return
        _add_scan(self.state, i, out)
        self.state.remaining -= 1
        if self.state.remaining == 0:
            _close_level(self.state)
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


_torch_lock = threading.Lock()
_torch_users = 0
_torch_threads_before = 0


@contextmanager
def single_threaded_torch() -> Iterator[None]:
    """Run torch ops on one thread each while scanning: parallelism comes from our workers.

    torch's intra-op threads on top of our worker threads oversubscribe the cores and make every
    small op slower; the previous setting comes back when the last scan in the process ends.
    """
    global _torch_users, _torch_threads_before
    with _torch_lock:
        if _torch_users == 0:
            _torch_threads_before = torch.get_num_threads()
            torch.set_num_threads(1)
        _torch_users += 1
    try:
        yield
    finally:
        with _torch_lock:
            _torch_users -= 1
            if _torch_users == 0:
                torch.set_num_threads(_torch_threads_before)


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def scan_tensors(plans: list[TensorPlan], reader: LocalFileReader, *,
                 progress: Callable[[int, int], None] | None = None,
                 workers: int | None = None,
                 resume: Mapping[str, FirstPass] | None = None) -> list[TensorResult]:
    """Scan every block of every plan (in order, `workers` blocks at a time); results per plan.

    `resume`: first passes already made of some tensors (by name; used where `matches` the
    plan): only their remaining threshold refinement passes read the files.
    Memory: about (2 x workers) blocks in flight plus one threshold histogram per open tensor.
    """
    workers = workers or default_workers()
    resumed = {k: r.state for k, p in enumerate(plans)
               if resume and (r := resume.get(p.name)) is not None and r.matches(p)}
    total = sum(p.span(i).nbytes for k, p in enumerate(plans) if _to_read(resumed.get(k))
                for i in range(len(p.rows)))
    done = 0
    results: list[TensorResult | None] = [None] * len(plans)
    refine: deque[tuple[_State, int, bool]] = deque()

    def blocks() -> Iterator[tuple[_State, int, bool]]:
        for k, plan in enumerate(plans):
            if k in resumed:
                st = resumed[k]
                st.plan, st.index = plan, k
                schedule_refine(st)
                continue
            st = _State(plan, k, [""] * len(plan.rows), remaining=len(plan.rows))
            if plan.mode != "hash":
                st.stats = [BlockStats(0.0, 0.0, 0.0, 0)] * len(plan.rows)
                st.trim = TrimThresholds(plan.entry.numel if plan.mode != "lora"
                                         else _lora_numel(plan))
            if plan.lora_a is not None:  # a LoRA tensor, with or without statistics
                st.lora_a, st.lora_a_hash = _read_lora_a(plan, reader)
            for i in range(len(plan.rows)):
                yield st, i, False

    source = blocks()

    def next_task() -> tuple[_State, int, bool] | None:
        if not refine:
            task = next(source, None)
            if task is not None or not refine:  # a resumed last tensor may just have queued some
                return task
        return refine.popleft()

    def finish_level(st: _State) -> None:
        _close_level(st)
        schedule_refine(st)

    def schedule_refine(st: _State) -> None:
        assert st.trim is not None
        if st.trim.pending:
            st.remaining = len(st.plan.rows)
            refine.extend((st, i, True) for i in range(len(st.plan.rows)))
        else:
            finish(st)

    def finish(st: _State) -> None:
        if st.trim is not None:
            st.trim.release()
        results[st.index] = TensorResult(st.plan.name, st.hashes,
                                         st.stats if st.trim is not None else None, st.trim,
                                         st.lora_a_hash)
        st.cached = st.lora_a = None

    window = 2 * workers
    inflight: deque[tuple[Future[Any], _State, int, bool]] = deque()
    pool: ThreadPoolExecutor | _Inline = (ThreadPoolExecutor(workers, "mergepipe-scan")
                                          if total >= INLINE_BELOW else _Inline())
    with single_threaded_torch(), pool:
        try:
            while True:
                while len(inflight) < window and (task := next_task()) is not None:
                    st, i, is_refine = task
                    fn = _refine_block if is_refine else _scan_block
                    inflight.append((pool.submit(fn, st, i, reader), st, i, is_refine))
                if not inflight:
                    break
                fut, st, i, is_refine = inflight.popleft()
                out = fut.result()
                st.remaining -= 1
                if is_refine:
                    assert st.trim is not None
                    st.trim.add(out)
                else:
                    _add_scan(st, i, out)
                    done += st.plan.span(i).nbytes
                    if progress is not None:
                        progress(done, total)
                if st.remaining == 0:
                    if st.trim is None:
                        finish(st)
                    else:
                        finish_level(st)
        finally:
            for fut, *_ in inflight:
                fut.cancel()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


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


class _Buffers(threading.local):
    """One worker thread's raw read buffers and tensor scratch, reused block after block."""

    def __init__(self) -> None:
        self.raw: dict[str, bytearray] = {}
        self.scratch = Scratch()

    def read(self, reader: LocalFileReader, name: str, span: Span) -> memoryview:
        buf = self.raw.get(name)
        if buf is None or len(buf) < span.nbytes:
            buf = self.raw[name] = bytearray(span.nbytes)
        view = memoryview(buf)[:span.nbytes]
        reader.read_into(span.path, span.offset, view)
        return view


_buffers = _Buffers()


# What the first pass finds in one block: content hash, delta stats, (level-0 histogram, mixed
# entries' bits), and the |delta| itself for a one-block tensor (for the threshold refinement).
BlockScan = tuple[str, BlockStats | None, tuple[Histogram | None, torch.Tensor | None],
                  torch.Tensor | None]


def _scan_block(st: _State, i: int, reader: LocalFileReader) -> BlockScan:
    plan = st.plan
    raw = _buffers.read(reader, "own", plan.span(i))
    digest = xxhash.xxh3_128_hexdigest(raw)
    if plan.mode == "hash":
        if has_nonfinite(raw, plan.entry.dtype):
            raise InvalidCheckpoint(f"{_where(plan, i)}: NaN or Inf in the weights")
        return digest, None, (None, None), None
    assert st.trim is not None
    return _scan_delta_block(st, i, raw, digest, reader, None, st.trim.collecting_mixed)


def scan_full_block(plan: TensorPlan, i: int, raw: memoryview, base_raw: memoryview,
                    digest: str | None = None) -> BlockScan:
    """The first pass over block i of a "full" plan from bytes already in memory (the
    executor's output block and its base block): exactly what scanning the files computes.

    `digest`: the xxh3-128 of `raw` when the caller knows it. Raises NonFiniteDelta.
    """
    assert plan.mode == "full"
    st = _State(plan, -1)
    return _scan_delta_block(st, i, raw, digest or xxhash.xxh3_128_hexdigest(raw), None,
                             base_raw, True)


def _scan_delta_block(st: _State, i: int, raw: memoryview, digest: str,
                      reader: LocalFileReader | None, base_raw: memoryview | None,
                      collect_mixed: bool) -> BlockScan:
    plan = st.plan
    if _same_as_base(plan, i, digest):  # an untouched block: its delta is exactly zero
        n = len(raw) // DTYPE_SIZES[plan.entry.dtype]
        return (digest, BlockStats(0.0, 0.0, 0.0, 0),
                ((torch.tensor([0]), torch.tensor([n])), None),
                torch.zeros(n) if len(plan.rows) == 1 else None)
    a = _abs_delta(st, i, raw, reader, base_raw)
    try:
        stats, counts, mixed = scan_block(a, _buffers.scratch, collect_mixed=collect_mixed)
    except NonFiniteDelta as e:
        if reader is None:
            raise
        raise InvalidCheckpoint(f"{_where(plan, i)}: {_nonfinite_cause(plan, raw, str(e))}"
                                ) from None
    return digest, stats, (counts, mixed), a.clone() if len(plan.rows) == 1 else None


def _same_as_base(plan: TensorPlan, i: int, digest: str) -> bool:
    """Whether block i holds the base's very bytes (same dtype and xxh3-128 content hash)."""
    return (plan.mode == "full" and plan.base_hashes is not None and plan.base is not None
            and plan.base.dtype == plan.entry.dtype and plan.base_hashes[i] == digest)


def _refine_block(st: _State, i: int, reader: LocalFileReader) -> Histogram:
    assert st.trim is not None
    if _same_as_base(st.plan, i, st.hashes[i]):  # n zeros: n times the counts of one zero
        one = st.trim.block_counts(torch.zeros(1, dtype=torch.int32))
        assert isinstance(one, tuple)
        return one[0], one[1] * (st.plan.span(i).nbytes // DTYPE_SIZES[st.plan.entry.dtype])
    a = _abs_delta(st, i, _buffers.read(reader, "own", st.plan.span(i)), reader)
    return st.trim.block_counts(a.view(torch.int32), _buffers.scratch)


def _abs_delta(st: _State, i: int, raw: memoryview, reader: LocalFileReader | None,
               base_raw: memoryview | None = None) -> torch.Tensor:
    """|delta| of block i as a flat float32 tensor (a thread-local buffer: use it or copy it).

    A full plan's base block is `base_raw` when given, else read with `reader`."""
    plan = st.plan
    n = len(raw) // DTYPE_SIZES[plan.entry.dtype]
    x = decode_into(raw, plan.entry.dtype, _buffers.scratch.get("x", n, torch.float32))
    if plan.mode == "full":
        assert plan.base is not None
        if base_raw is None:
            assert reader is not None
            base_raw = _buffers.read(reader, "base", plan.base_span(i))
        x.sub_(decode_into(base_raw, plan.base.dtype,
                           _buffers.scratch.get("y", n, torch.float32)))
    elif plan.mode == "lora":
        assert st.lora_a is not None and plan.lora_scale is not None
        start, end = plan.rows[i]
        x = lora_delta(x.view(end - start, -1), st.lora_a, plan.lora_scale).view(-1)
    return x.abs_()


def _read_lora_a(plan: TensorPlan, reader: LocalFileReader) -> tuple[torch.Tensor | None, str]:
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


def _lora_numel(plan: TensorPlan) -> int:
    assert plan.lora_a_shape is not None
    return plan.entry.shape[0] * plan.lora_a_shape[1]


def has_nonfinite(raw: bytearray | memoryview, dtype: str) -> bool:
    """Whether raw little-endian floats of `dtype` hold a NaN or an Inf (exponent all ones)."""
    if len(raw) == 0:
        return False
    int_dtype, mask = _NONFINITE[dtype]
    t = torch.frombuffer(raw, dtype=int_dtype)
    exponents = torch.bitwise_and(t, mask, out=_buffers.scratch.get("exp", t.numel(), int_dtype))
    return int(torch.amax(exponents)) == mask


def _where(plan: TensorPlan, i: int) -> str:
    start, end = plan.rows[i]
    return f"{plan.entry.file}: tensor {plan.name!r} block {i} (rows {start}..{end})"


def _nonfinite_cause(plan: TensorPlan, raw: memoryview, what: str) -> str:
    if has_nonfinite(raw, plan.entry.dtype):
        part = "lora_B" if plan.mode == "lora" else "weights"
        return f"NaN or Inf in the {part}"
    if plan.mode == "full":
        return f"the delta against the base is {what} (float32 overflow)"
    return f"the delta is {what} (float32 overflow)"
