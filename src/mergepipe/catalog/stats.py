"""Delta statistics: per-block norms and exact per-tensor TIES trim thresholds from bit histograms.

numpy and the C pass of mergepipe/core/delta_kernels.py only: no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mergepipe.core import delta_kernels

DENSITY_STEPS = 100  # trim thresholds for densities 0.01, 0.02, ..., 1.00
# A float32 |x| read as int32 is monotone in x. Its bits are resolved in three levels: the top 16
# (sign is 0: 2**15 bins), then the next 8, then the last 8. A bin whose lower bits are all zero
# holds one value only and needs no further level (the common case for bf16 / fp16 deltas).
LEVEL_SHIFTS = (16, 8, 0)
TOP_BINS = 1 << 15
SUB_BINS = 1 << 8
SPARSE_BELOW = 8192  # smaller blocks give (keys, counts): cheaper than 64Ki dense bins
MIXED_CAP = 1 << 22  # mixed entries kept per tensor at most (16 MiB), else refinement passes

Histogram = np.ndarray | tuple[np.ndarray, np.ndarray]  # dense int64 counts, or (keys, counts)


@dataclass(frozen=True)
class BlockStats:
    """Statistics of one block's float32 delta."""

    l2: float
    l1: float
    max_abs: float
    nnz: int
    # 2-D tensors: squared column norms per channel group (catalog.col_groups); None otherwise
    col_sq: list[float] | None = None


class NonFiniteDelta(ValueError):
    """A block's delta holds NaN or Inf (the caller names the tensor and block)."""


class Scratch:
    """Reusable buffers of one worker thread, so that the block kernels allocate nothing."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, np.dtype], np.ndarray] = {}

    def get(self, name: str, n: int, dtype: type[np.generic]) -> np.ndarray:
        key = (name, np.dtype(dtype))
        buf = self._bufs.get(key)
        if buf is None or buf.size < n:
            buf = self._bufs[key] = np.empty(max(n, 1), dtype=dtype)
        return buf[:n]


def trim_ks(numel: int) -> list[int]:
    """k for each density of the grid: max(1, int(density * numel)), density = (j + 1) / 100
    (mergekit's floor: a positive density keeps at least one entry of a nonempty tensor)."""
    return [max(1 if numel else 0, int((j + 1) / DENSITY_STEPS * numel))
            for j in range(DENSITY_STEPS)]


def scan_block(a: np.ndarray, scratch: Scratch | None = None, *, collect_mixed: bool = False
               ) -> tuple[BlockStats, Histogram, np.ndarray | None]:
    """Stats of a block from its flat float32 |delta|, its level-0 threshold histogram and,
    with `collect_mixed`, the bits of its "mixed" entries (lower 16 bits not all zero).

    The histogram has 2 * 2**15 counts: for each top-16-bit prefix, the entries whose lower 16
    bits are zero and those whose lower bits are not. Entries exactly 0 are key 0. max_abs and
    nnz are exact; l1 and l2 = sqrt(sum of squares) are float64 sums in the fixed order that
    mergepipe/core/delta_kernels.py defines (the same bits on every machine, C or numpy).
    """
    n = a.size
    if n == 0:
        return BlockStats(0.0, 0.0, 0.0, 0), np.zeros(2 * TOP_BINS, dtype=np.int64), None
    scratch = scratch or Scratch()
    dense = None
    if delta_kernels.available():  # one C pass: sums, max and (big blocks) the histogram
        if n >= SPARSE_BELOW:
            dense = np.zeros(2 * TOP_BINS, dtype=np.int64)
        buf = scratch.get("k0", n, np.int32) if collect_mixed and dense is not None else None
        l1, sq, max_abs, k = delta_kernels.block_pass(a, dense, buf)
    else:
        (l1, sq), max_abs = delta_kernels.lane_sums(a), float(np.max(a))
    if not math.isfinite(max_abs):
        raise NonFiniteDelta("NaN" if math.isnan(max_abs) else "Inf")
    l2 = math.sqrt(sq)
    if dense is not None:
        mixed = buf[:k].copy() if buf is not None and k else None
        return BlockStats(l2, l1, max_abs, n - int(dense[0])), dense, mixed
    bits = a.view(np.int32)
    key = scratch.get("k0", n, np.int32)
    low = scratch.get("k1", n, np.int32)
    np.left_shift(np.right_shift(bits, 16, out=key), 1, out=key)
    np.minimum(np.bitwise_and(bits, 0xFFFF, out=low), 1, out=low)
    np.bitwise_or(key, low, out=key)
    counts = _histogram(key, 2 * TOP_BINS)
    if isinstance(counts, np.ndarray):
        zeros, n_mixed = int(counts[0]), int(counts[1::2].sum())
    else:
        zeros, n_mixed = int(counts[1][counts[0] == 0].sum()), int(counts[1][counts[0] % 2 == 1].sum())
    mixed = bits[low != 0] if collect_mixed and n_mixed else None
    return BlockStats(l2, l1, max_abs, n - zeros), counts, mixed


def _histogram(key: np.ndarray, size: int) -> Histogram:
    if key.size < SPARSE_BELOW and key.size < size:
        keys, counts = np.unique(key, return_counts=True)
        return keys.astype(np.int64), counts.astype(np.int64)
    return np.bincount(key, minlength=size).astype(np.int64, copy=False)


class _Queries:
    """The unresolved thresholds, one entry per density index j (numpy int64 arrays)."""

    def __init__(self, j: np.ndarray, rank: np.ndarray) -> None:
        self.j = j
        self.rank = rank  # 1-based rank of the wanted value inside the current bin, largest first
        self.above = np.zeros_like(j)  # entries known to be larger than the current bin
        self.prefix = np.zeros_like(j)  # bits >> LEVEL_SHIFTS[level] of the current bin
        self.slot = np.zeros_like(j)  # the current bin among the bins refined at this level

    def __len__(self) -> int:
        return len(self.j)

    def take(self, keep: np.ndarray) -> _Queries:
        out = _Queries(self.j[keep], self.rank[keep])
        out.above, out.prefix, out.slot = self.above[keep], self.prefix[keep], self.slot[keep]
        return out


class TrimThresholds:
    """Exact trim thresholds of one tensor, fed block histograms level by level.

    Level 0 comes from `scan_block` (pass 1). While `pending`, the caller makes one more pass over
    the tensor's blocks, adding `block_counts(|delta| bits)` of each, then calls `finish_level`.
    Results: `tau[j]`, `above[j]`, `tied[j]` for density (j + 1) / 100.
    """

    def __init__(self, numel: int) -> None:
        self.numel = numel
        self.ks = trim_ks(numel)
        self.tau = [math.inf] * DENSITY_STEPS
        self.above = [0] * DENSITY_STEPS
        self.tied = [0] * DENSITY_STEPS
        self.level = 0
        self.n_slots = 1
        ks = np.array(self.ks, dtype=np.int64)
        self._q = _Queries(np.flatnonzero(ks > 0), ks[ks > 0])
        # Level L >= 1: int32 table from (slot at L-1, child) to slot at L; entries that lead to
        # no refined bin point at a last "dump" slot whose counts are thrown away.
        self._luts: list[np.ndarray] = []
        self._counts = np.zeros(2 * TOP_BINS, dtype=np.int64)
        # The bits of every mixed entry, while they are few: with them level 0 is exact for
        # bf16 / fp16 deltas (mixed entries are a few per mille there, 5-6% in a TIES output's
        # bf16 tensors: a cap of numel / 8 spares those the file's refinement passes at register
        # time); None once past the cap.
        self._mixed: list[np.ndarray] | None = []
        self._mixed_n = 0
        self._mixed_cap = min(MIXED_CAP, max(1 << 16, numel // 8))

    def release(self) -> None:
        """Drop the histograms and kept entries once resolved (only the results remain)."""
        assert not self.pending
        self._counts = np.zeros(0, dtype=np.int64)
        self._luts, self._mixed = [], None

    @property
    def collecting_mixed(self) -> bool:
        return self._mixed is not None and self.level == 0

    def add_mixed(self, bits: np.ndarray | None) -> None:
        """Keep a block's mixed entries (from scan_block) until there are too many of them."""
        if bits is None or self._mixed is None:
            return
        self._mixed_n += bits.size
        if self._mixed_n > self._mixed_cap:
            self._mixed = None
        else:
            self._mixed.append(bits)

    @property
    def pending(self) -> bool:
        return len(self._q) > 0

    def add(self, counts: Histogram) -> None:
        """Add a block's histogram (from scan_block at level 0, block_counts after)."""
        if isinstance(counts, np.ndarray):
            self._counts += counts[:self._counts.size]
        else:
            keys, n = counts
            keep = keys < self._counts.size
            np.add.at(self._counts, keys[keep], n[keep])

    def block_counts(self, bits: np.ndarray, scratch: Scratch | None = None) -> Histogram:
        """Histogram of one block for the current refinement level (bits = |delta| as int32)."""
        assert self.level >= 1
        scratch = scratch or Scratch()
        bits = bits.reshape(-1)
        n = bits.size
        slot, tmp, child = (scratch.get(k, n, np.int32) for k in ("k0", "k1", "k2"))
        np.take(self._luts[0], np.right_shift(bits, LEVEL_SHIFTS[0], out=tmp), out=slot,
                mode="clip")  # every index is in range: clip only skips numpy's buffering
        for lvl in range(2, self.level + 1):  # walk down to the bins refined at this level
            np.bitwise_and(np.right_shift(bits, LEVEL_SHIFTS[lvl - 1], out=child), 0xFF,
                           out=child)
            np.bitwise_or(np.left_shift(slot, 8, out=slot), child, out=slot)
            np.take(self._luts[lvl - 1], slot, out=tmp, mode="clip")
            slot, tmp = tmp, slot
        shift = LEVEL_SHIFTS[self.level]
        np.left_shift(slot, 9, out=slot)
        np.bitwise_and(np.right_shift(bits, shift, out=child), 0xFF, out=child)
        np.bitwise_or(slot, np.left_shift(child, 1, out=child), out=slot)
        if shift:
            np.minimum(np.bitwise_and(bits, (1 << shift) - 1, out=child), 1, out=child)
            np.bitwise_or(slot, child, out=slot)
        return _histogram(slot, 2 * SUB_BINS * (self.n_slots + 1))

    def solve_sorted(self, a: np.ndarray) -> None:
        """Resolve every pending query from all of the tensor's |delta| at once (small tensors)."""
        asc = np.sort(a.reshape(-1))
        n = asc.size
        q = self._q
        taus = asc[n - (q.above + q.rank)]
        lo = np.searchsorted(asc, taus, side="left")
        hi = np.searchsorted(asc, taus, side="right")
        self._set(q.j, taus.astype(np.float32).view(np.int32), n - hi, hi - lo)
        self._q = q.take(np.zeros(len(q), dtype=bool))

    def finish_level(self) -> None:
        """Resolve every query whose value is now known; set up the next level for the rest."""
        q = self._q
        if not len(q):
            return
        children = TOP_BINS if self.level == 0 else SUB_BINS
        counts = self._counts.reshape(self.n_slots, children, 2)
        # the same integers as counts.sum(axis=2), whose reduction over an axis of 2 is ~100x
        # slower: it was most of a tensor's finishing time
        total = counts[:, :, 0] + counts[:, :, 1]
        # Per slot, cumulative counts from the largest child down; rows made disjoint by an
        # offset so that one searchsorted serves every query.
        from_top = np.cumsum(total[:, ::-1], axis=1)
        span = self.numel + 1
        flat = (from_top + np.arange(self.n_slots)[:, None] * span).ravel()
        i = np.searchsorted(flat, q.rank + q.slot * span) - q.slot * children
        child = children - 1 - i
        in_bin = total[q.slot, child]
        above_in = from_top[q.slot, i] - in_bin
        q.rank = q.rank - above_in
        q.above = q.above + above_in
        q.prefix = child if self.level == 0 else (q.prefix << 8) | child
        shift = LEVEL_SHIFTS[self.level]
        single = counts[q.slot, child, 1] == 0  # one value: the lower bits are all zero
        self._set(q.j[single], (q.prefix[single] << shift), q.above[single], in_bin[single])
        rest = ~single
        if self.level == 0 and self._mixed and rest.any():
            self._resolve_mixed(q.take(rest), self._mixed_in(child[rest]), in_bin[rest])
            rest[:] = False
        self._q = q = q.take(rest)
        if not len(q):
            return
        if self.level + 1 >= len(LEVEL_SHIFTS):  # cannot happen: the last level has no lower bits
            raise AssertionError("trim threshold refinement did not converge")
        keys, q.slot = np.unique(q.slot * children + child[rest], return_inverse=True)
        # Indexed by (parent slot, child); the parent's dump slot (n_slots) leads to the dump too.
        lut = np.full((self.n_slots + (self.level > 0)) * children, len(keys), dtype=np.int32)
        lut[keys] = np.arange(len(keys), dtype=np.int32)
        self._luts.append(lut)
        self.level += 1
        self.n_slots = len(keys)
        self._counts = np.zeros(2 * SUB_BINS * self.n_slots, dtype=np.int64)

    def _mixed_in(self, bins: np.ndarray) -> np.ndarray:
        """The kept mixed entries of the level-0 bins `bins`, sorted (the only ones that
        `_resolve_mixed` looks at: sorting a few bins' entries, not all of them)."""
        assert self._mixed is not None
        mixed = np.concatenate(self._mixed)
        wanted = np.zeros(TOP_BINS, dtype=bool)
        wanted[bins] = True
        return np.sort(mixed[wanted[mixed >> LEVEL_SHIFTS[0]]])

    def _resolve_mixed(self, q: _Queries, mixed: np.ndarray, in_bin: np.ndarray) -> None:
        """Level 0, bins with mixed entries whose bits were all kept: pick values directly.

        A bin holds its mixed entries (known exactly) above in_bin - M entries equal to the
        bin's smallest value (prefix << 16, lower bits zero)."""
        lo_bits = q.prefix << 16
        lo = np.searchsorted(mixed, lo_bits, side="left")
        hi = np.searchsorted(mixed, lo_bits + (1 << 16), side="left")
        n_mixed = hi - lo
        pick = q.rank <= n_mixed  # the rank-th largest entry of the bin is a mixed one
        value = np.where(pick, mixed[np.clip(hi - q.rank, 0, max(len(mixed) - 1, 0))], lo_bits)
        first = np.searchsorted(mixed, value, side="left")
        last = np.searchsorted(mixed, value, side="right")
        self._set(q.j, value, q.above + np.where(pick, hi - last, n_mixed),
                  np.where(pick, last - first, in_bin - n_mixed))

    def _set(self, j: np.ndarray, bits: np.ndarray, above: np.ndarray, tied: np.ndarray) -> None:
        taus = np.asarray(bits, dtype=np.int64).astype(np.uint32).view(np.float32)
        for jj, t, a, n in zip(j.tolist(), taus.tolist(), above.tolist(), tied.tolist(),
                               strict=True):
            self.tau[jj], self.above[jj], self.tied[jj] = float(t), int(a), int(n)
