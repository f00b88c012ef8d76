"""Delta statistics: per-block norms and exact per-tensor TIES trim thresholds from bit histograms."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

DENSITY_STEPS = 100  # trim thresholds for densities 0.01, 0.02, ..., 1.00
# A float32 |x| read as int32 is monotone in x. Its bits are resolved in three levels: the top 16
# (sign is 0: 2**15 bins), then the next 8, then the last 8. A level stops early for a bin whose
# lower bits are all zero (one value only), which is the rule for bf16 / fp16 fine-tune deltas.
LEVEL_SHIFTS = (16, 8, 0)
TOP_BINS = 1 << 15
SUB_BINS = 1 << 8
SPARSE_BELOW = 8192  # smaller blocks give (keys, counts): cheaper than 64Ki dense bins

Histogram = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # dense counts, or (keys, counts)


@dataclass(frozen=True)
class BlockStats:
    """Statistics of one block's float32 delta."""

    l2: float
    l1: float
    max_abs: float
    nnz: int


class NonFiniteDelta(ValueError):
    """A block's delta holds NaN or Inf (the caller names the tensor and block)."""


def trim_ks(numel: int) -> list[int]:
    """k for each density of the grid: int(density * numel), density = (j + 1) / 100."""
    return [int((j + 1) / DENSITY_STEPS * numel) for j in range(DENSITY_STEPS)]


def scan_block(a: torch.Tensor) -> tuple[BlockStats, Histogram]:
    """Stats of a block from its flat float32 |delta|, and its level-0 threshold histogram.

    The histogram has 2 * 2**15 counts: for each top-16-bit prefix, the entries whose lower 16
    bits are zero and those whose lower bits are not. Entries that are exactly 0 are bin 0.
    """
    n = a.numel()
    if n == 0:
        return BlockStats(0.0, 0.0, 0.0, 0), torch.zeros(2 * TOP_BINS, dtype=torch.int64)
    max_abs = float(torch.amax(a))
    if not math.isfinite(max_abs):  # NaN propagates through amax
        raise NonFiniteDelta("NaN" if math.isnan(max_abs) else "Inf")
    bits = a.view(torch.int32)
    counts = _histogram(_mixed_key(bits, 16, bits >> 16), 2 * TOP_BINS)
    l1 = float(a.sum(dtype=torch.float64))
    l2 = float(torch.linalg.vector_norm(a, dtype=torch.float64))
    zeros = int(counts[0]) if isinstance(counts, torch.Tensor) else _sparse_count(counts, 0)
    return BlockStats(l2, l1, max_abs, n - zeros), counts



def _histogram(key: torch.Tensor, size: int) -> Histogram:
    if key.numel() < SPARSE_BELOW and key.numel() < size:
        keys, counts = torch.unique(key, return_counts=True)
        return keys.long(), counts
    return torch.bincount(key, minlength=size)


def _sparse_count(h: tuple[torch.Tensor, torch.Tensor], key: int) -> int:
    keys, counts = h
    hit = counts[keys == key]
    return int(hit[0]) if hit.numel() else 0


def _mixed_key(bits: torch.Tensor, shift: int, prefix: torch.Tensor) -> torch.Tensor:
    """2 * prefix + (bits below `shift` are not all zero)."""
    key = prefix << 1
    if shift:
        key |= (bits & ((1 << shift) - 1)).ne(0).to(key.dtype)
    return key


@dataclass
class _Query:
    j: int
    rank: int  # 1-based rank of the wanted value inside the current bin, largest first
    above: int  # entries of the tensor known to be larger than anything in the current bin
    prefix: int  # bits >> LEVEL_SHIFTS[level] of the current bin (level 0: unused)
    slot: int  # index of the current bin among the bins refined at this level


class TrimThresholds:
    """Exact trim thresholds of one tensor, fed block histograms level by level.

    Level 0 comes from `scan_block` (pass 1). While `pending`, the caller makes one more pass over
    the tensor's blocks, adding `block_counts(|delta| bits)` of each, then calls `finish_level`.
    """

    def __init__(self, numel: int) -> None:
        self.numel = numel
        self.ks = trim_ks(numel)
        self.tau = [math.inf] * DENSITY_STEPS
        self.above = [0] * DENSITY_STEPS
        self.tied = [0] * DENSITY_STEPS
        self.level = 0
        self.n_slots = 1
        self._queries = [_Query(j, k, 0, 0, 0) for j, k in enumerate(self.ks) if k > 0]
        self._luts: list[torch.Tensor] = []  # level L >= 1: (slot at L-1, child) -> slot at L
        self._counts = torch.zeros(2 * TOP_BINS, dtype=torch.int64)

    @property
    def pending(self) -> bool:
        return bool(self._queries)

    def add(self, counts: Histogram) -> None:
        if isinstance(counts, torch.Tensor):
            self._counts += counts
        else:
            self._counts.index_add_(0, counts[0], counts[1])

    def block_counts(self, bits: torch.Tensor) -> Histogram:
        """Histogram of one block for the current refinement level (bits = |delta| as int32)."""
        assert self.level >= 1
        sel = bits.reshape(-1)
        slot = torch.zeros(0, dtype=torch.int64)
        for lvl, lut in enumerate(self._luts, start=1):
            if lvl == 1:
                idx = torch.index_select(lut, 0, (sel >> LEVEL_SHIFTS[0]).long())
            else:
                child = ((sel >> LEVEL_SHIFTS[lvl - 1]) & (SUB_BINS - 1)).long()
                idx = torch.index_select(lut, 0, slot * SUB_BINS + child)
            keep = idx >= 0
            sel, slot = sel[keep], idx[keep]
        shift = LEVEL_SHIFTS[self.level]
        child = ((sel >> shift) & (SUB_BINS - 1)).long()
        key = _mixed_key(sel, shift, slot * SUB_BINS + child)
        return _histogram(key, 2 * SUB_BINS * self.n_slots)

    def solve_sorted(self, a: torch.Tensor) -> None:
        """Resolve every pending query from all of the tensor's |delta| at once (small tensors)."""
        asc = torch.sort(a.reshape(-1)).values
        n = asc.numel()
        ks = torch.tensor([q.above + q.rank for q in self._queries], dtype=torch.int64)
        taus = asc[n - ks]
        lo = torch.searchsorted(asc, taus, right=False)
        hi = torch.searchsorted(asc, taus, right=True)
        for q, tau, lo_i, hi_i in zip(self._queries, taus.tolist(), lo.tolist(), hi.tolist(),
                                      strict=True):
            self.tau[q.j], self.above[q.j], self.tied[q.j] = float(tau), n - hi_i, hi_i - lo_i
        self._queries = []

    def finish_level(self) -> None:
        """Resolve every query whose value is now known; set up the next level for the rest."""
        if not self._queries:
            return
        children = TOP_BINS if self.level == 0 else SUB_BINS
        counts = self._counts.view(self.n_slots, children, 2).numpy()
        total = counts.sum(axis=2)
        # Cumulative counts from the largest child down, per slot.
        from_top = np.cumsum(total[:, ::-1], axis=1)
        unresolved: list[_Query] = []
        for q in self._queries:
            cs = from_top[q.slot]
            i = int(np.searchsorted(cs, q.rank))  # first i with cs[i] >= rank
            child = children - 1 - i
            above_in = int(cs[i]) - int(total[q.slot, child])
            q.rank -= above_in
            q.above += above_in
            q.prefix = child if self.level == 0 else (q.prefix << 8) | child
            if counts[q.slot, child, 1] == 0:  # one value: lower bits all zero
                self.tau[q.j] = _f32(q.prefix << LEVEL_SHIFTS[self.level])
                self.above[q.j] = q.above
                self.tied[q.j] = int(total[q.slot, child])
            else:
                q.slot = q.slot * children + child  # provisional key, remapped below
                unresolved.append(q)
        self._queries = unresolved
        if not unresolved:
            return
        if self.level + 1 >= len(LEVEL_SHIFTS):  # cannot happen: the last level has no lower bits
            raise AssertionError("trim threshold refinement did not converge")
        keys = sorted({q.slot for q in unresolved})
        lut = torch.full((self.n_slots * children,), -1, dtype=torch.int64)
        lut[torch.tensor(keys)] = torch.arange(len(keys))
        remap = {k: i for i, k in enumerate(keys)}
        for q in unresolved:
            q.slot = remap[q.slot]
        self._luts.append(lut)
        self.level += 1
        self.n_slots = len(keys)
        self._counts = torch.zeros(2 * SUB_BINS * self.n_slots, dtype=torch.int64)


def _f32(bits: int) -> float:
    """The float32 value with these bits, as a Python float (exact)."""
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])
