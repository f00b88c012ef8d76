"""The divisor of the normalized operators: the weights' sum in float32, left to right, with
mergekit's guard (|sum| < 1e-8 -> 1). numpy scalars, so that the fused kernels need no torch;
the torch kernels take the same value as a tensor (sparsify.weight_total)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def weight_total(weights: Sequence[float]) -> np.float32:
    """Sum of weights in float32, left to right; |sum| < 1e-8 -> 1."""
    total = np.float32(weights[0])
    for w in weights[1:]:
        total = np.float32(total + np.float32(w))
    return total if abs(total) >= np.float32(1e-8) else np.float32(1.0)
