"""Squared column norms of a 2-D delta summed over channel groups, for activation-aware ranking
(docs/catalog.md#calibrations)."""

from __future__ import annotations

import numpy as np

GROUPS = 16


def bounds(n_in: int) -> np.ndarray:
    """The GROUPS + 1 channel boundaries of a tensor with `n_in` columns (empty groups when
    n_in < GROUPS)."""
    return (np.arange(GROUPS + 1, dtype=np.int64) * n_in) // GROUPS


def _group_sums(per_channel: np.ndarray, n_in: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(per_channel, dtype=np.float64)])
    b = bounds(n_in)
    return c[b[1:]] - c[b[:-1]]


def block_col_sq(a: np.ndarray, shape: tuple[int, ...], start: int) -> list[float] | None:
    """Per channel group, the sum of squares of a block's delta entries in that group's columns
    (float32 sums per column for a row grid: a ranking statistic, not a bound).
    `a`: the block's flat float32 delta (or |delta|), `start`: its first element's flat index in
    the tensor. None for a tensor that is not 2-D."""
    if len(shape) != 2 or shape[1] == 0:
        return None
    n_in = int(shape[1])
    if start % n_in == 0 and a.size % n_in == 0:  # whole rows (a row grid): one float32 pass
        x = a.reshape(-1, n_in)
        per_channel = np.einsum("ij,ij->j", x, x).astype(np.float64)
    else:  # an element grid's block: any flat range
        cols = (np.arange(a.size, dtype=np.int64) + start) % n_in
        per_channel = np.bincount(cols, weights=np.square(a, dtype=np.float64), minlength=n_in)
    return [float(v) for v in _group_sums(per_channel, n_in)]


def zero_col_sq(shape: tuple[int, ...]) -> list[float] | None:
    """The groups of an all-zero block (None for a tensor that is not 2-D)."""
    return [0.0] * GROUPS if len(shape) == 2 and shape[1] else None


def group_mean_square(rms: np.ndarray) -> list[float]:
    """Per channel group, the mean of rms_j^2 over its channels (0 for an empty group)."""
    n_in = rms.size
    sums = _group_sums(np.square(rms, dtype=np.float64), n_in)
    sizes = np.diff(bounds(n_in))
    return [float(s / k) if k else 0.0 for s, k in zip(sums, sizes, strict=True)]
