"""Stream a checkpoint's blocks through worker threads: content hashes, delta stats, trim thresholds."""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mergepipe.catalog.scan_block import (
    BlockScan,
    Span,
    TensorPlan,
    TensorResult,
    TensorState,
    add_scan,
    close_level,
    new_state,
    read_lora_a,
    refine_block,
    scan_full_block,
    scan_own_block,
    untouched_scan,
)
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.torch_threads import pin_torch_threads
from mergepipe.storage.storage import RangeReader, open_reader
from mergepipe.storage.store_types import Stamp

__all__ = ["BlockScan", "FirstPass", "Span", "TensorPlan", "TensorResult", "scan_full_block",
           "scan_pinned", "scan_tensors", "untouched_scan"]

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
                         if (r := self.resumed.get(k)) is None or r.trim is None
                         or r.trim.pending)
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
