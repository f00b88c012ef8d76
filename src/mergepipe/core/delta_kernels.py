"""The catalog's passes over a block's delta: |delta| from raw bytes and the block's statistics, in
C (mergepipe/core/_fused.c) or, without the extension, in numpy with the same bits (no torch).
The sums are the lane sums of docs/catalog.md ("l1"): 8 float64 lanes, combined pairwise."""

from __future__ import annotations

from typing import Any

import numpy as np

from mergepipe.core import native
from mergepipe.core.native import CODES

_fused: Any = native.EXTENSION  # None: numpy serves, same bits
LANES = 8
_ROWS = 1 << 15  # lane rows per numpy chunk (1 MiB of float64 per sum)


def available() -> bool:
    return _fused is not None


def abs_delta_into(out: np.ndarray, raw: Any, dtype: str, base_raw: Any | None,
                   base_dtype: str) -> np.ndarray:
    """out (flat float32) = |decode(raw) - decode(base_raw)| (|decode(raw)| without a base) in
    one C pass; the bits of numpy's (and torch's) decode, subtract and abs."""
    assert _fused is not None
    _fused.abs_delta(out, raw, CODES[dtype], base_raw, CODES[base_dtype], out.size)
    return out


def block_pass(a: np.ndarray, counts: np.ndarray | None = None, mixed: np.ndarray | None = None
               ) -> tuple[float, float, float, int]:
    """One C pass over the flat float32 |delta| a: (l1, sum of squares, max, number of mixed
    entries). With `counts` (2**16 int64 zeros) also the level-0 threshold histogram (key =
    (bits >> 16) << 1, + 1 when the lower 16 bits are not all zero) and, with an int32 buffer
    `mixed` of a's size, the bits of the mixed entries at its start. max: inf or nan when a
    holds one."""
    assert _fused is not None
    l1, sq, top, k = _fused.stats(a, counts, mixed)
    return l1, sq, float(np.uint32(top).view(np.float32)), k


def lane_sums(a: np.ndarray) -> tuple[float, float]:
    """(l1, sum of squares) of the flat float32 |delta| a, as defined above, in numpy:
    np.cumsum along axis 0 of an (n / 8, 8) float64 view adds each lane in index order."""
    n = a.size
    acc = np.zeros((2, LANES), dtype=np.float64)  # running lane sums: values, squares
    for at in range(0, n, _ROWS * LANES):
        part = np.abs(a[at:at + _ROWS * LANES], dtype=np.float64)
        pad = -part.size % LANES  # + 0.0 changes no sum (all sums are >= +0.0)
        rows = np.concatenate([part, np.zeros(pad)]).reshape(-1, LANES)
        for j, x in enumerate((rows, rows * rows)):
            acc[j] = np.cumsum(np.vstack([acc[j:j + 1], x]), axis=0)[-1]
    s, q = acc
    return _total(s), _total(q)


def _total(x: np.ndarray) -> float:
    v = [float(t) for t in x]
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
