"""Counter-based keyed randomness: one uniform per (seed, expert, tensor, flat element index).

u(key, i) = (splitmix64(splitmix64(key) + (i + 1) * golden_gamma) >> 11) / 2**53, a pure
function of the key and the element's flat index in its tensor: the same value whatever the
block grid, the order of the blocks, the threads or the budget.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64 increment (golden ratio)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1
_BITS = 53  # random bits per uniform (a float64 mantissa)


def expert_key(seed: int, model: str, tensor: str) -> int:
    """64-bit key of one expert tensor's random stream (blake2b of seed, model and tensor name)."""
    msg = f"{int(seed)}\x00{model}\x00{tensor}".encode()
    return int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "little")


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, in place on a uint64 array (wrapping arithmetic)."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _bits(key: int, index: np.ndarray) -> np.ndarray:
    """The 53 random bits of each flat index (uint64 array, consumed in place)."""
    stream = _mix(np.array([key & _MASK64], dtype=np.uint64))[0]  # decorrelate nearby keys
    index += np.uint64(1)
    index *= _GAMMA
    index += stream
    return _mix(index) >> np.uint64(64 - _BITS)


def _range(flat_offset: int, numel: int) -> np.ndarray:
    if flat_offset < 0 or numel < 0:
        raise ValueError(f"flat_offset {flat_offset} and numel {numel} must be >= 0")
    return np.arange(flat_offset, flat_offset + numel, dtype=np.uint64)


def _threshold(p: float) -> np.uint64:
    """Integer T with bits < T  <=>  bits / 2**53 < p, for p in [0, 1]."""
    return np.uint64(math.ceil(min(max(p, 0.0), 1.0) * 2.0**_BITS))


def uniform(key: int, flat_offset: int, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """float64 uniforms in [0, 1) for a block whose first element has flat index `flat_offset`."""
    bits = _bits(key, _range(flat_offset, math.prod(shape)))
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-_BITS).reshape(tuple(shape))


def below(key: int, flat_offset: int, shape: tuple[int, ...] | torch.Size,
          p: float) -> torch.Tensor:
    """uniform(key, flat_offset, shape) < p, computed on the integers (no floats made)."""
    bits = _bits(key, _range(flat_offset, math.prod(shape)))
    return torch.from_numpy(bits < _threshold(p)).reshape(tuple(shape))


def below_at(key: int, flat_index: torch.Tensor, p: float) -> torch.Tensor:
    """uniform < p at the given flat indexes (int64, >= 0): for sparse draws such as ties."""
    index = flat_index.numpy().astype(np.uint64)
    if index.size and int(flat_index.min()) < 0:
        raise ValueError("flat indexes must be >= 0")
    return torch.from_numpy(_bits(key, index) < _threshold(p))
