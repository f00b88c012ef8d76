"""Counter-based keyed randomness: one uniform per (seed, expert, tensor, flat element index),
u(key, i) = (splitmix64(splitmix64(key) + (i + 1) * golden_gamma) >> 11) / 2**53, whatever the
block grid, the block order, the threads or the budget."""

from __future__ import annotations

import hashlib
import math
import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the torch wrappers below load torch when called: the fused path has none
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
    index *= _GAMMA
    index += np.uint64(_start(key, 0))
    return _mix(index) >> np.uint64(64 - _BITS)


def bits_at(key: int, flat_index: np.ndarray) -> np.ndarray:
    """The 53 bits of uniform(key, i) * 2^53 at the given flat indexes (an int array >= 0)."""
    return _bits(key, flat_index.astype(np.uint64))


def _range(flat_offset: int, numel: int) -> np.ndarray:
    if flat_offset < 0 or numel < 0:
        raise ValueError(f"flat_offset {flat_offset} and numel {numel} must be >= 0")
    return np.arange(flat_offset, flat_offset + numel, dtype=np.uint64)


def _threshold(p: float) -> np.uint64:
    """Integer T with bits < T  <=>  bits / 2**53 < p, for p in [0, 1]."""
    return np.uint64(math.ceil(min(max(p, 0.0), 1.0) * 2.0**_BITS))


def uniform(key: int, flat_offset: int, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
    """float64 uniforms in [0, 1) for a block whose first element has flat index `flat_offset`."""
    import torch

    bits = _bits(key, _range(flat_offset, math.prod(shape)))
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-_BITS).reshape(tuple(shape))


def below(key: int, flat_offset: int, shape: tuple[int, ...] | torch.Size,
          p: float) -> torch.Tensor:
    """uniform(key, flat_offset, shape) < p, computed on the integers (no floats made)."""
    import torch

    bits = _bits(key, _range(flat_offset, math.prod(shape)))
    return torch.from_numpy(bits < _threshold(p)).reshape(tuple(shape))


def below_at(key: int, flat_index: torch.Tensor, p: float) -> torch.Tensor:
    """uniform < p at the given flat indexes (int64, >= 0): for sparse draws such as ties."""
    if flat_index.numel() and int(flat_index.min()) < 0:
        raise ValueError("flat indexes must be >= 0")
    import torch

    return torch.from_numpy(_bits(key, flat_index.numpy().astype(np.uint64)) < _threshold(p))


def not_below_at(key: int, flat_offset: int, index: np.ndarray, p: float) -> np.ndarray:
    """~below_at(key, flat_offset + index, p) for an int64 array of indexes >= 0 (a bool array)."""
    threshold = int(_threshold(p))
    if threshold == 0 or threshold >= 1 << _BITS:
        return np.full(index.size, threshold == 0)
    z, t = _words.get(index.size)
    np.multiply(index.view(np.uint64), _GAMMA, out=z)
    z += np.uint64(_start(key, flat_offset))
    _mix_into(z, t)
    return np.greater_equal(z, np.uint64(threshold << (64 - _BITS)))


# -- the dense draw of a whole block, in a few in-place passes (the DARE mask) ---------------------

DRAW_CHUNK = 1 << 15  # words per piece of a dense draw (2 x 256 KiB of work arrays)
_ramp_lock = threading.Lock()
_ramp = np.zeros(0, dtype=np.uint64)  # i * golden_gamma for i < len: shared, never written after


def _gamma_ramp(n: int) -> np.ndarray:
    global _ramp
    ramp = _ramp
    if ramp.size < n:
        with _ramp_lock:
            if _ramp.size < n:
                _ramp = np.arange(max(n, 2 * _ramp.size), dtype=np.uint64) * _GAMMA
            ramp = _ramp
    return ramp[:n]


class _Words(threading.local):
    """Two uint64 work arrays per thread, reused block after block."""

    def __init__(self) -> None:
        self.z = np.zeros(0, dtype=np.uint64)
        self.t = np.zeros(0, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.z.size < n:
            self.z, self.t = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
        return self.z[:n], self.t[:n]


_words = _Words()


def below_into(key: int, flat_offset: int, out: np.ndarray, p: float) -> np.ndarray:
    """`out` (a flat float32 array) = 1.0 where uniform(key, flat_offset + i) < p, else 0.0: the
    draws of `below` without temporaries (the shared ramp i * gamma plus one constant, the
    finalizer in place, bits >> 11 < T compared as the 64-bit word < T << 11)."""
    n = out.size
    if flat_offset < 0:
        raise ValueError(f"flat_offset {flat_offset} must be >= 0")
    threshold = int(_threshold(p))
    if threshold == 0 or threshold >= 1 << _BITS:
        out.fill(0.0 if threshold == 0 else 1.0)
        return out
    start, limit = np.uint64(_start(key, flat_offset)), np.uint64(threshold << (64 - _BITS))
    ramp = _gamma_ramp(n)
    z, t = _words.get(min(n, DRAW_CHUNK))
    for a in range(0, n, DRAW_CHUNK):  # cache-sized pieces: the ten passes stay in L2
        b = min(n, a + DRAW_CHUNK)
        za, ta = z[:b - a], t[:b - a]
        np.add(ramp[a:b], start, out=za)
        _mix_into(za, ta)
        np.less(za, limit, out=out[a:b], casting="unsafe")
    return out


def _start(key: int, flat_offset: int) -> int:
    """(flat_offset + 1) * gamma + stream (mod 2**64): the counter of index 0 of a block."""
    stream = int(_mix(np.array([key & _MASK64], dtype=np.uint64))[0])  # decorrelates near keys
    return ((flat_offset + 1) * int(_GAMMA) + stream) & _MASK64


def _mix_into(z: np.ndarray, t: np.ndarray) -> None:
    """_mix without temporaries (t: a work array of z's size)."""
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        np.right_shift(z, np.uint64(shift), out=t)
        np.bitwise_xor(z, t, out=z)
        if mult is not None:
            np.multiply(z, mult, out=z)
