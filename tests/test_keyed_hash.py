"""Keyed counter-based randomness: reference values, block independence, uniformity."""

from __future__ import annotations

import math

import pytest
import torch

from mergepipe.core.operators.keyed_hash import below, below_at, expert_key, uniform

MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _reference(key: int, index: int) -> float:
    """Pure-Python splitmix64 of (key, flat index): the documented stream."""
    z = (_mix(key) + (index + 1) * 0x9E3779B97F4A7C15) & MASK
    return (_mix(z) >> 11) / 2.0**53


def test_matches_pure_python_splitmix64():
    key = expert_key(7, "expert-a", "model.layers.0.mlp.up_proj.weight")
    u = uniform(key, 1000, (3, 5))
    assert u.dtype == torch.float64 and u.shape == (3, 5)
    expected = [_reference(key, 1000 + i) for i in range(15)]
    assert u.flatten().tolist() == expected


def test_large_offsets_and_keys_wrap_like_uint64():
    key = MASK  # the largest key
    off = 2**40 + 3  # a flat index far beyond any real tensor
    assert uniform(key, off, (4,)).tolist() == [_reference(key, off + i) for i in range(4)]


def test_expert_key_is_64_bit_and_depends_on_every_part():
    k = expert_key(0, "m", "t")
    assert 0 <= k < 2**64
    assert k == expert_key(0, "m", "t")
    others = {expert_key(1, "m", "t"), expert_key(0, "m2", "t"), expert_key(0, "m", "t2"),
              expert_key(0, "mt", ""), expert_key(0, "", "mt")}
    assert k not in others and len(others) == 5


@pytest.mark.parametrize("cuts", [[0, 100], [0, 1, 2, 99, 100], [0, 37, 64, 100]])
def test_same_values_whatever_the_block_split(cuts):
    key = expert_key(3, "e", "w")
    whole = uniform(key, 0, (100, 6))
    parts = [uniform(key, a * 6, (b - a, 6)) for a, b in zip(cuts, cuts[1:], strict=False)]
    assert torch.equal(torch.cat(parts), whole)
    # ... and whatever the order the blocks are drawn in
    again = [uniform(key, a * 6, (b - a, 6)) for a, b in reversed(list(zip(cuts, cuts[1:], strict=False)))]
    assert torch.equal(torch.cat(list(reversed(again))), whole)


def test_uniformity_chi_square_and_moments():
    n, bins = 200_000, 20
    u = uniform(expert_key(0, "e", "t"), 0, (n,))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.bincount((u * bins).long(), minlength=bins).double()
    chi2 = float(((counts - n / bins) ** 2 / (n / bins)).sum())
    assert chi2 < 45.3  # 99.9% quantile of chi-square with 19 degrees of freedom
    assert abs(float(u.mean()) - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert abs(float(u.var()) - 1 / 12) < 0.002


def test_neighbouring_elements_and_keys_are_uncorrelated():
    n = 100_000
    a = uniform(expert_key(0, "e0", "t"), 0, (n + 1,))
    b = uniform(expert_key(0, "e1", "t"), 0, (n,))
    c = uniform(expert_key(1, "e0", "t"), 0, (n,))
    bound = 5 / math.sqrt(n)
    for x, y in ((a[:-1], a[1:]), (a[:-1], b), (a[:-1], c)):
        assert abs(float(torch.corrcoef(torch.stack([x, y]))[0, 1])) < bound


def test_empty_block_and_bad_offset():
    assert uniform(1, 5, (0, 4)).shape == (0, 4)
    with pytest.raises(ValueError):
        uniform(1, -1, (2,))


@pytest.mark.parametrize("p", [0.0, 1e-9, 0.3, 0.5, 0.999, 1.0])
def test_below_is_uniform_less_than_p_without_floats(p):
    key = expert_key(2, "e", "t")
    u = uniform(key, 17, (50, 40))
    assert torch.equal(below(key, 17, (50, 40), p), u < p)
    idx = torch.tensor([17, 18, 500, 2016, 3], dtype=torch.int64)
    assert below_at(key, idx, p).tolist() == [_reference(key, int(i)) < p for i in idx]


def test_below_at_an_exact_draw_is_strict():
    key = expert_key(0, "e", "t")
    u = uniform(key, 0, (1000,))
    for i in (0, 7, 999):
        p = float(u[i])  # p equal to the draw: not below
        assert not bool(below(key, 0, (1000,), p)[i])
        assert not bool(below_at(key, torch.tensor([i]), p)[0])
        assert bool(below_at(key, torch.tensor([i]), p + 2.0**-53)[0])
    with pytest.raises(ValueError):
        below_at(key, torch.tensor([-1]), 0.5)
