"""Reference (unfused) versions of the sparse operators' pieces, for the tests to compare against.

The product uses the fused kernels of mergepipe.core.operators.sparsify; these are the same float
operations written plainly (mergekit's order), kept here as the test oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mergepipe.core.operators.base import Trim
from mergepipe.core.operators.keyed_hash import below, below_at
from mergepipe.core.operators.sparsify import L1_EPS, RESCALES, ordered_sum


def trim_mask(delta: torch.Tensor, trim: Trim | None, key: int,
              flat_offset: int) -> torch.Tensor | None:
    """TIES keep-mask: |d| > tau, and |d| == tau iff uniform(key, index) < (k - above) / tied.

    None means keep everything (no trim, i.e. density 1). The tie rule keeps k entries of the
    tensor in expectation and is block-local: the same whatever the block grid or budget.
    """
    if trim is None:
        return None
    mag = delta.abs().contiguous()
    if trim.k >= trim.above + trim.tied:  # every tied entry is kept (density 1)
        return mag >= trim.tau
    keep = mag > trim.tau
    if trim.tied > 0 and trim.k > trim.above:
        at_tau = (mag == trim.tau).reshape(-1).nonzero().squeeze(1)
        if at_tau.numel():
            p = (trim.k - trim.above) / trim.tied
            keep.view(-1)[at_tau] = below_at(key, at_tau + flat_offset, p)
    return keep


def magnitude_trim(delta: torch.Tensor, trim: Trim | None, key: int,
                   flat_offset: int) -> torch.Tensor:
    """The trimmed delta of TIES (entries outside trim_mask set to zero)."""
    keep = trim_mask(delta, trim, key, flat_offset)
    return delta if keep is None else delta * keep


def drop_mask(key: int, flat_offset: int, shape: torch.Size | tuple[int, ...],
              density: float) -> torch.Tensor | None:
    """DARE keep-mask: entry kept iff uniform(key, flat index) < density; None = keep all."""
    if density >= 1.0:
        return None
    if density <= 0.0:
        raise ValueError(f"density {density} must be in (0, 1]")
    return below(key, flat_offset, shape, density)


def random_drop(delta: torch.Tensor, density: float, key: int, flat_offset: int,
                rescale: str = "density") -> torch.Tensor:
    """DARE: drop entries with probability 1 - density, then rescale the kept ones.

    rescale 'density' divides by density (the DARE paper); 'l1' scales the block so its L1
    norm equals the pre-drop L1 norm (mergekit does this per tensor); 'none' leaves them.
    """
    if rescale not in RESCALES:
        raise ValueError(f"rescale {rescale!r} must be one of {RESCALES}")
    keep = drop_mask(key, flat_offset, delta.shape, density)
    if keep is None:
        return delta
    kept = delta * keep
    if rescale == "density":
        return kept / density
    if rescale == "l1":
        before, after = delta.abs().sum(), kept.abs().sum()
        if before < L1_EPS or after < L1_EPS:
            return kept
        return kept * (before / after)
    return kept


def weighted(delta: torch.Tensor, weight: float) -> torch.Tensor:
    """w * delta with w rounded to float32 first (as mergekit's float32 weight tensor)."""
    return delta * torch.tensor(weight, dtype=delta.dtype)


def disjoint_sum(weighted_deltas: Sequence[torch.Tensor], weights: Sequence[float]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """TIES sign election and disjoint sum: (mixed, divisor).

    The elected sign is that of the sum of the weighted deltas (0 counts as +); an entry is
    kept where its sign equals the elected one, so zeros never vote. `mixed` sums the kept
    entries, `divisor` the weights of the kept entries (0 -> 1, as mergekit).
    """
    elected = torch.ones_like(weighted_deltas[0])
    elected[ordered_sum(weighted_deltas) < 0] = -1.0
    mixed = torch.zeros_like(weighted_deltas[0])
    divisor = torch.zeros_like(weighted_deltas[0])
    for wd, w in zip(weighted_deltas, weights, strict=True):
        keep = (wd * elected) > 0  # same sign as elected; zeros (and NaN) never vote
        mixed += wd * keep
        divisor += torch.tensor(w, dtype=divisor.dtype) * keep
    divisor[divisor == 0] = 1
    return mixed, divisor


def finish(base: torch.Tensor, mixed: torch.Tensor, lam: float,
           divisor: torch.Tensor | None = None) -> torch.Tensor:
    """M = B + lambda * mixed / divisor, in mergekit's operation order."""
    if divisor is not None:
        mixed = mixed / divisor
    if lam != 1.0:
        mixed = mixed * lam
    return base + mixed
