"""Coalesced, parallel, counted byte-range reads, prefetched a few chunks ahead of the compute."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from mergepipe.core.errors import BudgetViolation
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
        for futures in self._pending.values():
            for f in futures:
                f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
