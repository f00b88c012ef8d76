"""The block schedule (base blocks in chunks) and its reads: coalesced, counted, prefetched."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from mergepipe.catalog.models import BlockRow
from mergepipe.core.errors import BudgetViolation
from mergepipe.executor.prepare import Prepared
from mergepipe.storage.grid import is_element_grid, unit_numel
from mergepipe.storage.locations import is_url
from mergepipe.storage.storage import RangeReader

# Adjacent ranges are merged into one read up to this many bytes (memory stays bounded).
MAX_COALESCED_BYTES = 8 << 20


@dataclass(frozen=True)
class Range:
    """One piece the compute needs: `nbytes` at `offset` of `path`, known by `key`."""

    key: Hashable
    path: str
    offset: int
    nbytes: int
    expert: bool  # counted against the expert budget (else a base read)
    check: Callable[[memoryview], None] | None = None  # e.g. content-hash verification


@dataclass
class ReadUnit:
    """One pread covering one or more adjacent ranges of the same file."""

    path: str
    offset: int
    nbytes: int
    expert: bool
    pieces: list[Range] = field(default_factory=list)


def coalesce(ranges: Sequence[Range], max_bytes: int = MAX_COALESCED_BYTES) -> list[ReadUnit]:
    """Merge ranges of the same file that touch end to start into single reads."""
    units: list[ReadUnit] = []
    for r in sorted(ranges, key=lambda r: (r.path, r.offset)):
        u = units[-1] if units else None
        if (u is not None and u.path == r.path and u.expert == r.expert
                and u.offset + u.nbytes == r.offset and u.nbytes + r.nbytes <= max_bytes):
            u.nbytes += r.nbytes
            u.pieces.append(r)
        else:
            units.append(ReadUnit(r.path, r.offset, r.nbytes, r.expert, [r]))
    return units


class BudgetCounter:
    """Expert bytes reserved before each read is issued; refuses to pass the budget."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.reserved = 0

    def reserve(self, nbytes: int, what: str) -> None:
        if self.reserved + nbytes > self.budget_bytes:
            raise BudgetViolation(
                f"reading {what} ({nbytes} bytes) would bring expert reads to "
                f"{self.reserved + nbytes} bytes, over the budget of {self.budget_bytes}")
        self.reserved += nbytes


class Prefetcher:
    """Reads chunk i+1.. in a thread pool while chunk i is computed; pieces come back by key."""

    def __init__(self, chunks: Sequence[Sequence[Range]], *, expert_reader: RangeReader,
                 base_reader: RangeReader, budget: BudgetCounter, threads: int,
                 depth: int = 2) -> None:
        self._chunks = chunks
        self._expert_reader = expert_reader
        self._base_reader = base_reader
        self._budget = budget
        self._depth = max(1, depth)
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads),
                                        thread_name_prefix="mergepipe-read")
        self._pending: dict[int, list[Future[list[tuple[Hashable, memoryview]]]]] = {}
        self._next = 0

    def _submit_upto(self, last: int) -> None:
        while self._next <= min(last, len(self._chunks) - 1):
            futures = []
            for unit in coalesce(self._chunks[self._next]):
                if unit.expert:
                    self._budget.reserve(unit.nbytes, f"{unit.path} at offset {unit.offset}")
                futures.append(self._pool.submit(self._read, unit))
            self._pending[self._next] = futures
            self._next += 1

    def _read(self, unit: ReadUnit) -> list[tuple[Hashable, memoryview]]:
        buf = np.empty(unit.nbytes, dtype=np.uint8).data  # not zeroed: read over next
        reader = self._expert_reader if unit.expert else self._base_reader
        reader.read_into(unit.path, unit.offset, buf)
        out = []
        for r in unit.pieces:
            piece = buf[r.offset - unit.offset: r.offset - unit.offset + r.nbytes]
            if r.check is not None:
                r.check(piece)
            out.append((r.key, piece))
        return out

    def get(self, i: int) -> dict[Hashable, memoryview]:
        """The pieces of chunk i (keeps `depth` more chunks in flight)."""
        self._submit_upto(i + self._depth)
        out: dict[Hashable, memoryview] = {}
        for f in self._pending.pop(i):
            out.update(f.result())
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # reads not started: cancelled
        self._pending.clear()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Step:
    """One base block and the expert positions whose block is read for it."""

    tensor: str
    block_index: int
    row_start: int  # grid units (rows, or elements of a tensor cut into element ranges)
    row_end: int
    experts: set[int]
    last_of_tensor: list[int]  # LoRA experts whose lora_A can be dropped after this block
    flat_start: int = 0  # flat index of the block's first element
    shape: tuple[int, ...] = ()  # the block's shape: (rows, *row shape), or (elements,)
    # a whole untouched one-block tensor, never read: the output is this base block's bytes,
    # copied by the kernel and verified against its catalogued hash (executor.writer)
    copy_from: BlockRow | None = None
    read_base: bool = True  # False exactly when copy_from is set


def schedule(prep: Prepared, chunk_bytes: int) -> tuple[list[list[Step]], list[list[Range]]]:
    """Steps in checkpoint order grouped into chunks, with the byte ranges each chunk needs."""
    base = prep.base
    sel_index: dict[tuple[int, str], dict[int, BlockRow]] = {
        k: {b.block_index: b for b in v} for k, v in prep.selected.items()}
    by_tensor: dict[str, list[int]] = {}
    for i, tensor in prep.selected:
        by_tensor.setdefault(tensor, []).append(i)
    steps: list[list[Step]] = []
    chunks: list[list[Range]] = []
    cur_steps: list[Step] = []
    cur_ranges: list[Range] = []
    cur_bytes = 0
    whole = prep.plan.request.whole_tensor
    for t in base.tensors.values():
        positions = sorted(by_tensor.get(t.name, []))
        last = {i: max(sel_index[(i, t.name)]) for i in positions}
        first = {i: min(sel_index[(i, t.name)]) for i in positions}
        blocks = base.tensor_blocks(t.name)
        # the output block is the base's bytes where no expert block is read (not so under
        # mergekit's arithmetic, which runs every block through the operator)
        same_dtype = (prep.out_dtype or t.dtype) == t.dtype and not prep.mergekit_arith
        units = blocks[-1].row_end
        per_unit = unit_numel(t.shape, units)
        flat = is_element_grid(t.shape, units) or len(t.shape) <= 1
        for bblk in blocks:
            bi = bblk.block_index
            path = base.file_path(bblk.file_index)
            untouched = same_dtype and not positions and len(blocks) == 1 and not is_url(path)
            ranges = [] if untouched else [Range(("b", t.name, bi), path, bblk.byte_offset,
                                                 bblk.nbytes, False,
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
                                        lora_a.offset, lora_a.nbytes, True,
                                        partial(e.verify_lora_a, t.name, lora_a)))
            n = bblk.row_end - bblk.row_start
            step = Step(t.name, bi, bblk.row_start, bblk.row_end, readers,
                        [i for i in positions if last[i] == bi], bblk.row_start * per_unit,
                        ((n,) if flat else (n, *t.shape[1:])) if t.shape else (),
                        bblk if untouched else None, not untouched)
            cur_steps.append(step)
            cur_ranges.extend(ranges)
            cur_bytes += sum(r.nbytes for r in ranges)
            # a whole-tensor operator gets each tensor's blocks in one chunk (executor.torch_path)
            if cur_bytes >= chunk_bytes and (whole is None or bblk is blocks[-1]):
                steps.append(cur_steps)
                chunks.append(cur_ranges)
                cur_steps, cur_ranges, cur_bytes = [], [], 0
    if cur_steps:
        steps.append(cur_steps)
        chunks.append(cur_ranges)
    return steps, chunks
