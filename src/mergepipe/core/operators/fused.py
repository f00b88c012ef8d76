"""Fused block kernels: linear, task arithmetic and TIES (and DARE's drop before them) from raw bytes
to output bytes in one C pass, bit-identical to the torch kernels (docs/development.md: why C,
compiled with -ffp-contract=off). Without the extension `available()` is False and the torch
kernels serve. A block whose output holds a NaN comes back None (torch's vector and scalar
conversions disagree on NaN bits) and the torch kernels recompute it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mergepipe.core import native
from mergepipe.core.native import CODES
from mergepipe.core.operators.base import BlockContext, Trim
from mergepipe.core.operators.keyed_hash import _BITS, _start, _threshold
from mergepipe.core.operators.spec import OperatorSpec
from mergepipe.core.vocab import DTYPE_SIZES

_fused: Any = native.EXTENSION  # None: the torch kernels serve


def weight_total(weights: Sequence[float]) -> np.float32:
    """The divisor of the normalized operators, the fused and the torch kernels' alike: the
    weights' sum in float32, left to right, with mergekit's guard (|sum| < 1e-8 -> 1)."""
    total = np.float32(weights[0])
    for w in weights[1:]:
        total = np.float32(total + np.float32(w))
    return total if abs(total) >= np.float32(1e-8) else np.float32(1.0)


def available() -> bool:
    return _fused is not None


def covers(spec: OperatorSpec, params: Mapping[str, Any]) -> bool:
    """Whether the C kernels compute the blocks of the operator under these request parameters,
    for experts stored full or as deltas (a block whose output holds a NaN still goes to the
    torch kernels)."""
    fk = spec.fused
    if _fused is None or fk is None or params.get("semantics") == "mergekit":
        return False
    if fk.drop:  # l1: a norm over the whole block
        return str(params.get("rescale", "density")) in ("density", "none")
    if fk.c_kernel == "ties":
        return params.get("rescale", "none") == "none"
    return True


@dataclass(frozen=True)
class FusedExpert:
    """One read expert's block: raw bytes (a full model's values, or a delta) and parameters."""

    raw: Any  # a buffer of `numel` elements of `dtype`
    dtype: str
    full: bool  # True: raw holds the expert's values (delta = value - base)
    weight: float
    trim: Trim | None = None
    key: int = 0
    density: float = 1.0  # DARE's keep probability


def merge_block(spec: OperatorSpec, base_raw: Any, base_dtype: str,
                experts: Sequence[FusedExpert], ctx: BlockContext, out_dtype: str, numel: int
                ) -> memoryview | None:
    """The output bytes of one block, or None: no kernel for this case, or a NaN in the output
    (the torch kernels compute it then)."""
    if not covers(spec, ctx.params) or ctx.whole_tensor or not experts or numel == 0:
        return None
    assert spec.fused is not None
    kernel, normalize = spec.fused.c_kernel, spec.normalize_default
    if spec.fused.drop:
        if any(e.density <= 0 for e in experts):
            return None  # density 0: the torch kernels' error
        rescale = str(ctx.params.get("rescale", "density"))
        args = [_drop_args(e, ctx.flat_offset, rescale) for e in experts]
    elif kernel == "ties":
        args = [_ties_args(e, ctx.flat_offset) for e in experts]
    else:
        args = [(*_head(e), 0, 0.0, 0, 0.0, 0, 0) for e in experts]
    out = np.empty(numel * DTYPE_SIZES[out_dtype], dtype=np.uint8)
    lam = ctx.lam
    oc, bc = CODES[out_dtype], CODES[base_dtype]
    if kernel == "ties":
        nan = _fused.ties(out, oc, base_raw, bc, args, numel, ctx.normalize(normalize),
                          lam != 1.0, lam)
    else:
        divisor = _divisor(normalize, experts, ctx)
        nan = _fused.linear(out, oc, base_raw, bc, args, numel, divisor is not None,
                            divisor or 0.0, lam != 1.0, lam)
    return None if nan else out.data


def _head(e: FusedExpert) -> tuple[Any, int, bool, float]:
    return (e.raw, CODES[e.dtype], e.full, e.weight)


def _divisor(normalize: bool, experts: Sequence[FusedExpert], ctx: BlockContext
             ) -> float | None:
    """The linear kernels' divisor (weight_total) under normalize (the operator's default:
    `normalize`), or None: all experts' weights, or (linear's renormalize=selected) the weights
    of the experts read for the block."""
    if not ctx.normalize(normalize):
        return None
    selected = ctx.params.get("renormalize", "fixed") == "selected"
    weights = [e.weight for e in experts] if selected else list(ctx.all_weights)
    return float(weight_total(weights))


def _drop_args(e: FusedExpert, flat_offset: int, rescale: str) -> tuple[Any, ...]:
    """sparsify.dropped_into as parameters: (mode 2, -, 0, divisor, start, limit)."""
    if e.density >= 1.0:  # the delta as is
        return (*_head(e), 0, 0.0, 0, 0.0, 0, 0)
    div = e.density if rescale == "density" else 0.0
    threshold = int(_threshold(e.density))  # 1 <= it < 2**53 for 0 < density < 1
    return (*_head(e), 2, 0.0, 0, div, _start(e.key, flat_offset),
            threshold << (64 - _BITS))


def _ties_args(e: FusedExpert, flat_offset: int) -> tuple[Any, ...]:
    """(raw, code, full, weight, trim?, lambd, ties mode, tau, start, limit): sparsify.trimmed_into
    as parameters (ties mode: 0 keep tied entries, 1 keyed draw, 2 drop every tied entry)."""
    head = _head(e)
    trim = e.trim
    if trim is None:
        return (*head, False, 0.0, 0, 0.0, 0, 0)
    tau = np.float32(trim.tau)
    if trim.k <= trim.above or trim.tied == 0:  # keep |d| > tau
        return (*head, True, float(tau), 0, 0.0, 0, 0)
    # |d| >= tau: everything when tau is 0, else |d| > the next float32 below tau
    shrink = (True, float(np.nextafter(tau, np.float32(0)))) if tau != 0 else (False, 0.0)
    if trim.k >= trim.above + trim.tied:  # every tied entry is kept
        return (*head, *shrink, 0, 0.0, 0, 0)
    threshold = int(_threshold((trim.k - trim.above) / trim.tied))
    if threshold >= 1 << _BITS:
        return (*head, *shrink, 0, 0.0, 0, 0)
    if threshold == 0:
        return (*head, *shrink, 2, float(tau), 0, 0)
    return (*head, *shrink, 1, float(tau), _start(e.key, flat_offset),
            threshold << (64 - _BITS))

