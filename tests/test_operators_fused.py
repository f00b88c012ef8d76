"""The fused operator kernels give bit for bit what the reference pieces of sparsify give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mergepipe.core.operators.keyed_hash import below, below_at, below_into, not_below_at
from mergepipe.core.operators.sparsify import (
    dropped_into,
    elect_into,
    finish_into,
    trimmed_into,
)
from tests.operator_helpers import exact_trim
from tests.operator_reference import disjoint_sum, finish, magnitude_trim, random_drop, weighted


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def tie_heavy(seed: int, shape=(37, 53)) -> torch.Tensor:
    """bf16-rounded deltas: a few ulps wide, so many entries tie at any threshold."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g).to(torch.bfloat16).float()
    expert = (base + 0.01 * torch.randn(shape, generator=g)).to(torch.bfloat16).float()
    d = expert - base
    d[0, :7] = 0.0
    d[1, :3] = -0.0
    return d


@pytest.mark.parametrize("offset", [0, 1, 12345, 2**40 + 3])
@pytest.mark.parametrize("p", [0.0, 1e-9, 0.3, 0.5, 0.999, 1.0])
def test_dense_and_sparse_draws_equal_the_reference(offset, p):
    n = 1000
    out = np.empty(n, dtype=np.float32)
    ref = below(77, offset, (n,), p).numpy()
    assert np.array_equal(below_into(77, offset, out, p), ref.astype(np.float32))
    index = np.array([0, 3, 4, 999, 500], dtype=np.int64)
    at = below_at(77, torch.from_numpy(index + offset), p).numpy()
    assert np.array_equal(not_below_at(77, offset, index, p), ~at)
    assert np.array_equal(at, ref[index])


@pytest.mark.parametrize("density", [0.0001, 0.2, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("offset", [0, 999])
def test_trimmed_into_is_magnitude_trim(density, offset):
    d = tie_heavy(1)
    trim = exact_trim(d, density)
    ref = magnitude_trim(d, trim, 5, offset)
    got = trimmed_into(d, trim, 5, offset, torch.empty_like(d))
    assert torch.equal(got, ref)  # removed entries may be zeros of either sign
    assert torch.equal(trimmed_into(d, None, 5, offset, torch.empty_like(d)), d)


@pytest.mark.parametrize("rescale", ["density", "l1", "none"])
@pytest.mark.parametrize("density", [0.1, 0.5, 1.0])
def test_dropped_into_is_random_drop(rescale, density):
    d = tie_heavy(2)
    ref = random_drop(d, density, 9, 31, rescale)
    assert torch.equal(bits(dropped_into(d, density, 9, 31, rescale, torch.empty_like(d))),
                       bits(ref))


@pytest.mark.parametrize("weights", [[1.0, 1.0, 1.0], [0.3, 2.0, 0.7], [1.0, -1.0, 2.5]])
@pytest.mark.parametrize("lam", [1.0, 0.6, -1.0])
def test_elect_and_finish_into_are_disjoint_sum_and_finish(weights, lam):
    ds = [weighted(magnitude_trim(d, exact_trim(d, 0.4), i, 0), w)
          for i, (d, w) in enumerate(zip([tie_heavy(s) for s in range(3)], weights, strict=True))]
    base = tie_heavy(9)
    base[2, :5] = -0.0
    mixed, divisor = disjoint_sum(ds, weights)
    out, div = torch.empty_like(base), torch.empty_like(base)
    elect_into(ds, weights, out, div)
    assert torch.equal(bits(out), bits(mixed)) and torch.equal(bits(div), bits(divisor))
    for dv, dv_ref in ((div, divisor), (None, None)):
        elect_into(ds, weights, out, None)
        assert torch.equal(bits(finish_into(out, base, lam, dv)),
                           bits(finish(base, mixed, lam, dv_ref)))
