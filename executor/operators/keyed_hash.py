"""Counter-based keyed randomness: one uniform per (seed, expert, tensor, flat element index)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64 increment (golden ratio)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


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


def hash64(key: int, flat_offset: int, numel: int) -> np.ndarray:
    """splitmix64 outputs for elements flat_offset .. flat_offset+numel-1 of stream `key`."""
    if flat_offset < 0 or numel < 0:
        raise ValueError(f"flat_offset {flat_offset} and numel {numel} must be >= 0")
    stream = _mix(np.array([key & _MASK64], dtype=np.uint64))[0]  # decorrelate nearby keys
    with np.errstate(over="ignore"):
        z = np.arange(flat_offset + 1, flat_offset + numel + 1, dtype=np.uint64)
        z *= _GAMMA
        z += stream
        return _mix(z)


def uniform(key: int, flat_offset: int, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """float64 uniforms in [0, 1) (53 random bits) for a block starting at `flat_offset`."""
    numel = math.prod(shape)
    bits = hash64(key, flat_offset, numel) >> np.uint64(11)
    u = bits.astype(np.float64) * (1.0 / (1 << 53))
    return torch.from_numpy(u).reshape(tuple(shape))
