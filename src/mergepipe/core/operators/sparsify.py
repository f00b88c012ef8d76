"""Shared pieces of the sparse operators: magnitude trim, random drop + rescale, sign election.

Sums run left to right in request order, so a merged element depends only on its own inputs,
never on the block's shape. The fused pieces (`*_into`) do the float operations of the plain
reference versions (tests/operator_reference.py) in the same order, into reused per-thread
buffers, with masks as 0/1 float32 arrays from numpy comparisons (an order of magnitude faster
than torch's bool masks here). Removed entries may be zeros of either sign; no result depends on
that sign (a zero never votes, is never kept, and adding it to the +0-initialized sums changes
nothing)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from mergepipe.core.operators import fused
from mergepipe.core.operators.base import RESCALES, Trim
from mergepipe.core.operators.keyed_hash import below_into, not_below_at

L1_EPS = 1e-7  # mergekit rescaled_masked_tensor: norms below this are left unscaled


def ordered_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Elementwise sum, left to right in the given order."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc += t
    return acc


def weight_total(weights: Sequence[float]) -> torch.Tensor:
    """Sum of weights in float32, left to right; |sum| < 1e-8 -> 1 (mergekit's guard)."""
    return torch.tensor(fused.weight_total(weights), dtype=torch.float32)


class _Scratch(threading.local):
    """Float32 buffers of one thread, by name, reused block after block."""

    def __init__(self) -> None:
        self.bufs: dict[object, torch.Tensor] = {}

    def like(self, name: object, t: torch.Tensor) -> torch.Tensor:
        """A buffer of t's shape (contents undefined)."""
        n = t.numel()
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < n:
            buf = self.bufs[name] = torch.empty(max(n, 1), dtype=torch.float32)
        return buf[:n].view(t.shape)

    def array(self, name: object, t: torch.Tensor, dtype: type = np.float32) -> np.ndarray:
        """A flat numpy buffer with t's element count."""
        key = (name, np.dtype(dtype).str)
        buf = self.bufs.get(key)
        n = t.numel() * np.dtype(dtype).itemsize
        if buf is None or buf.numel() < n:
            buf = self.bufs[key] = torch.empty(max(n, 1), dtype=torch.uint8)
        return buf[:n].numpy().view(dtype)


scratch = _Scratch()
_ZERO = torch.zeros((), dtype=torch.float32)


def scale_(t: torch.Tensor, weight: float) -> torch.Tensor:
    """t *= weight rounded to float32 (as `weighted`); a weight of 1.0 changes nothing."""
    w32 = f32(weight)
    return t if w32 == 1.0 else t.mul_(w32)


def flat(t: torch.Tensor) -> np.ndarray:
    """The numpy view of a contiguous float32 tensor, flat."""
    return t.reshape(-1).numpy()


def f32(x: float) -> float:
    """x rounded to float32 (as torch.tensor(x, dtype=torch.float32) rounds it)."""
    return float(np.float32(x))


def trimmed_into(delta: torch.Tensor, trim: Trim | None, key: int, flat_offset: int,
                 out: torch.Tensor) -> torch.Tensor:
    """out = magnitude_trim(delta, trim, key, flat_offset) (removed entries: zeros)."""
    if trim is None:
        return out.copy_(delta)
    tau = np.float32(trim.tau)
    if trim.k <= trim.above or trim.tied == 0:  # keep |d| > tau
        return torch.ops.aten.hardshrink.out(delta, float(tau), out=out)
    if tau == 0:  # |d| >= 0: everything
        out.copy_(delta)
    else:  # |d| >= tau  <=>  |d| > the next float32 below tau
        torch.ops.aten.hardshrink.out(delta, float(np.nextafter(tau, np.float32(0))), out=out)
    if trim.k >= trim.above + trim.tied:  # every tied entry is kept
        return out
    # drop the tied entries whose keyed draw is not below (k - above) / tied
    d = flat(delta.contiguous())
    eq, neg = scratch.array("eq", delta, np.bool_), scratch.array("eq-", delta, np.bool_)
    at_tau = np.flatnonzero(np.logical_or(np.equal(d, tau, out=eq), np.equal(d, -tau, out=neg),
                                          out=eq))
    if at_tau.size:
        p = (trim.k - trim.above) / trim.tied
        flat(out)[at_tau[not_below_at(key, flat_offset, at_tau, p)]] = 0.0
    return out


def dropped_into(delta: torch.Tensor, density: float, key: int, flat_offset: int,
                 rescale: str, out: torch.Tensor) -> torch.Tensor:
    """out = random_drop(delta, density, key, flat_offset, rescale)."""
    if rescale not in RESCALES:
        raise ValueError(f"rescale {rescale!r} must be one of {RESCALES}")
    if density >= 1.0:
        return out.copy_(delta)
    if density <= 0.0:
        raise ValueError(f"density {density} must be in (0, 1]")
    keep = scratch.like("keep", delta)
    below_into(key, flat_offset, flat(keep), density)
    torch.mul(delta, keep, out=out)
    if rescale == "density":
        out.div_(density)
    elif rescale == "l1":
        before = torch.abs(delta, out=keep).sum()
        after = torch.abs(out, out=keep).sum()
        if not (before < L1_EPS or after < L1_EPS):
            out.mul_(before / after)
    return out


def ordered_sum_into(tensors: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """out = ordered_sum(tensors)."""
    if len(tensors) == 1:
        return out.copy_(tensors[0])
    torch.add(tensors[0], tensors[1], out=out)
    for t in tensors[2:]:
        out.add_(t)
    return out


def elect_into(weighted_deltas: Sequence[torch.Tensor], weights: Sequence[float],
               mixed: torch.Tensor, divisor: torch.Tensor | None) -> None:
    """disjoint_sum into `mixed` and (when given) `divisor`."""
    like = weighted_deltas[0]
    total = ordered_sum_into(weighted_deltas, scratch.like("total", like))
    sign = scratch.like("sign", like)  # the elected sign: -1 where the sum is < 0, else +1
    s = flat(sign)
    np.less(flat(total), np.float32(0), out=s, casting="unsafe")
    s *= np.float32(-2)
    s += np.float32(1)
    agree = scratch.like("agree", like)
    keep = scratch.like("keep", like)
    zero = _ZERO  # the sums start at +0.0 (broadcast: no pass to clear them)
    for j, (wd, w) in enumerate(zip(weighted_deltas, weights, strict=True)):
        torch.mul(wd, sign, out=agree)
        np.greater(flat(agree), np.float32(0), out=flat(keep), casting="unsafe")
        # + wd * keep: the product is exact, fused or not
        torch.addcmul(zero if j == 0 else mixed, wd, keep, out=mixed)
        if divisor is not None:
            torch.add(zero if j == 0 else divisor, keep, alpha=f32(w), out=divisor)
    if divisor is not None:  # 0 -> 1: adding 1.0 where it is 0 (either sign), 0.0 elsewhere
        d = flat(divisor)
        d += np.equal(d, np.float32(0), out=flat(keep), casting="unsafe")


def weighted_sum_into(deltas: Sequence[torch.Tensor], weights: Sequence[float],
                      out: torch.Tensor) -> torch.Tensor:
    """out = ordered_sum([weighted(d, w) for d, w in zip(deltas, weights)])."""
    term = scratch.like("term", out)
    for j, (d, w) in enumerate(zip(deltas, weights, strict=True)):
        w32 = f32(w)
        if j == 0:
            torch.mul(d, w32, out=out) if w32 != 1.0 else out.copy_(d)
        else:  # d * 1.0 is d: skip the product
            out.add_(torch.mul(d, w32, out=term) if w32 != 1.0 else d)
    return out


def finish_into(out: torch.Tensor, base: torch.Tensor, lam: float,
                divisor: torch.Tensor | None = None) -> torch.Tensor:
    """out = finish(base, out, lam, divisor), in place."""
    if divisor is not None:
        out.div_(divisor)
    if lam != 1.0:
        out.mul_(lam)
    return torch.add(base, out, out=out)
