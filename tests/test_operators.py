"""Block operators: hand-computed results and invariants (masks, block splits, seeds)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mergepipe.core.operators import REGISTRY, BlockContext, ExpertBlock
from mergepipe.core.operators.keyed_hash import expert_key, uniform
from tests.operator_helpers import TrimThreshold, exact_trim, merge_tensor, row_blocks
from tests.operator_reference import disjoint_sum, drop_mask, random_drop, trim_mask

T = torch.tensor
OPS = ("linear", "task_arithmetic", "ties", "dare_linear", "dare_ties")  # block operators
WHOLE_TENSOR = ("slerp", "nuslerp", "model_stock")  # tests/test_geometric_operators.py


def test_registry_names_the_operators():
    assert tuple(REGISTRY)[:len(OPS)] == OPS  # then the newer operators (own tests)
    assert set(WHOLE_TENSOR) <= set(REGISTRY)
    assert all(REGISTRY[op].whole_tensor is None for op in OPS)
    assert all(callable(s.kernel) for s in REGISTRY.values())


# -- hand-computed -----------------------------------------------------------------------------

B4 = T([1.0, 2.0, 3.0, 4.0])
D1, D2 = T([1.0, 0.0, -2.0, 4.0]), T([3.0, 2.0, 2.0, 0.0])


@pytest.mark.parametrize(("params", "omit", "expected"), [
    ({}, None, [3.5, 3.5, 4.0, 5.0]),                       # alpha = 1/4, 3/4
    ({"lambda": 2.0}, None, [6.0, 5.0, 5.0, 6.0]),
    ({"normalize": False}, None, [11.0, 8.0, 7.0, 8.0]),    # alpha = w
    ({}, {1: {0}}, [1.25, 2.0, 2.5, 5.0]),                  # D2 omitted: coefficients fixed
    ({"renormalize": "selected"}, {1: {0}}, [2.0, 2.0, 1.0, 8.0]),  # divide by w1 only
    ({"renormalize": "selected"}, None, [3.5, 3.5, 4.0, 5.0]),
])
def test_linear_by_hand(params, omit, expected):
    out = merge_tensor("linear", B4, [D1, D2], [1.0, 3.0], params=params, omit=omit)
    assert out.tolist() == expected


@pytest.mark.parametrize(("params", "expected"), [
    ({}, [11.0, 8.0, 7.0, 8.0]),                              # B + D1 + 3 D2
    ({"lambda": 0.5}, [6.0, 5.0, 5.0, 6.0]),                  # B + (D1 + 3 D2) / 2
    ({"normalize": True}, [3.5, 3.5, 4.0, 5.0]),              # divide by 1 + 3
    ({"normalize": True, "lambda": 2.0}, [6.0, 5.0, 5.0, 6.0]),
])
def test_task_arithmetic_by_hand(params, expected):
    assert merge_tensor("task_arithmetic", B4, [D1, D2], [1.0, 3.0],
                        params=params).tolist() == expected


# Three experts, density 0.5 of 6 entries -> k = 3, tau = 2 for each, one entry at tau each.
TD = [T([4.0, -1.0, 2.0, -3.0, 0.5, 1.0]),   # trimmed: [4, 0, 2, -3, 0, 0]
      T([-2.0, 3.0, 1.0, 1.0, -5.0, 0.0]),   # trimmed: [-2, 3, 0, 0, -5, 0]
      T([3.0, 1.0, -4.0, 0.5, 2.0, -0.5])]   # trimmed: [3, 0, -4, 0, 2, 0]
TW = [1.0, 2.0, 1.0]
# weighted: W1 = [4, 0, 2, -3, 0, 0], W2 = [-4, 6, 0, 0, -10, 0], W3 = [3, 0, -4, 0, 2, 0]
# sums: [3, 6, -2, -3, -8, 0] -> signs + + - - - + (0 counts as +)
# kept sums:    [4+3, 6, -4, -3, -10, 0]; kept weights: [1+1, 2, 1, 1, 2, 0 -> 1]


def test_ties_trims_by_hand():
    for d in TD:
        assert exact_trim(d, 0.5) == TrimThreshold(2.0, 2, 1, 3)
    kept = trim_mask(TD[0], exact_trim(TD[0], 0.5), key=0, flat_offset=0)
    assert kept is not None and kept.tolist() == [True, False, True, True, False, False]


@pytest.mark.parametrize(("params", "expected"), [
    ({}, [3.5, 3.0, -4.0, -3.0, -5.0, 0.0]),
    ({"normalize": False}, [7.0, 6.0, -4.0, -3.0, -10.0, 0.0]),
    ({"lambda": 0.5}, [1.75, 1.5, -2.0, -1.5, -2.5, 0.0]),
])
def test_ties_by_hand(params, expected):
    base = torch.zeros(6)
    out = merge_tensor("ties", base, TD, TW, densities=[0.5] * 3, params=params)
    assert out.tolist() == expected


def test_ties_omitted_expert_neither_votes_nor_counts():
    # Without expert 2 (W2): sums [7, 0, -2, -3, 2, 0] -> + + - - + +
    out = merge_tensor("ties", torch.zeros(6), TD, TW, densities=[0.5] * 3, omit={1: {0}})
    assert out.tolist() == [3.5, 0.0, -4.0, -3.0, 2.0, 0.0]


def test_ties_zero_sum_elects_plus_and_zeros_never_vote():
    w = [T([1.0, 0.0]), T([-1.0, 0.0]), T([0.0, 0.0])]
    mixed, divisor = disjoint_sum(w, [1.0, 1.0, 1.0])
    assert mixed.tolist() == [1.0, 0.0] and divisor.tolist() == [1.0, 1.0]


def test_dare_by_hand_with_the_keyed_mask():
    key = expert_key(5, "e0", "t")
    d = T([[1.0, -2.0, 3.0], [4.0, -5.0, 6.0]])
    keep = (uniform(key, 0, (2, 3)) < 0.5)
    out = merge_tensor("dare_linear", torch.zeros(2, 3), [d], [2.0], densities=[0.5], seed=5)
    assert out.tolist() == (d * keep * 4.0).tolist()  # w / density = 2 / 0.5
    l1 = merge_tensor("dare_linear", torch.zeros(2, 3), [d], [1.0], densities=[0.5], seed=5,
                      params={"rescale": "l1"})
    assert math.isclose(float(l1.abs().sum()), 21.0, rel_tol=1e-6)
    assert torch.equal(l1 != 0, keep)
    none = merge_tensor("dare_linear", torch.zeros(2, 3), [d], [1.0], densities=[0.5], seed=5,
                        params={"rescale": "none"})
    assert torch.equal(none, d * keep)


# -- the TIES tie rule -------------------------------------------------------------------------

def test_tie_rule_keeps_k_in_expectation_and_is_keyed():
    g = torch.Generator().manual_seed(0)
    # bf16-like deltas: a few distinct magnitudes, so many entries sit exactly at tau
    d = (torch.randint(-4, 5, (400, 50), generator=g) * 2.0**-10).float()
    trim = exact_trim(d, 0.3)
    assert trim.tied > 1000 and trim.above < trim.k < trim.above + trim.tied
    key = expert_key(0, "e", "t")
    keep = trim_mask(d, trim, key, 0)
    assert keep is not None
    at_tau = d.abs() == trim.tau
    assert torch.equal(keep & ~at_tau, d.abs() > trim.tau)
    p = (trim.k - trim.above) / trim.tied
    assert torch.equal(keep & at_tau, at_tau & (uniform(key, 0, d.shape) < p))
    sd = math.sqrt(trim.tied * p * (1 - p))
    assert abs(int(keep.sum()) - trim.k) < 5 * sd
    other = trim_mask(d, trim, expert_key(1, "e", "t"), 0)
    assert other is not None and not torch.equal(keep, other)


@pytest.mark.parametrize("op", ["ties", "dare_ties"])
def test_tie_heavy_merge_is_the_same_whatever_the_block_split(op):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(30, 8, generator=g)
    deltas = [(torch.randint(-3, 4, (30, 8), generator=g) * 2.0**-9).float() for _ in range(3)]
    trims = [exact_trim(d, 0.4) for d in deltas]
    assert all(t.tied > t.k - t.above > 0 for t in trims)  # the tie rule decides
    w, dens = [1.0, 2.0, 0.5], [0.4] * 3
    whole = merge_tensor(op, base, deltas, w, densities=dens, trims=trims, seed=3)
    for sizes in ([1], [4, 9], [7, 7, 7]):
        split = merge_tensor(op, base, deltas, w, densities=dens, trims=trims, seed=3,
                             blocks=row_blocks(30, sizes))
        assert torch.equal(whole, split), sizes


def test_trim_density_one_and_none_keep_everything():
    d = T([0.0, 1.0, -1.0, 1.0])
    full = trim_mask(d, exact_trim(d, 1.0), 0, 0)
    assert full is not None and bool(full.all())
    assert trim_mask(d, None, 0, 0) is None
    # int(0.1 * 4) = 0: mergekit's floor keeps k = 1, among the three entries tied at |d| = 1
    one = trim_mask(d, exact_trim(d, 0.1), 0, 0)
    assert exact_trim(d, 0.1).k == 1 and one is not None and not bool(one[0])


# -- invariants --------------------------------------------------------------------------------

def _family(k: int = 3, shape: tuple[int, ...] = (24, 10), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g)
    deltas = [torch.randn(shape, generator=g) * 0.01 for _ in range(k)]
    return base, deltas


@pytest.mark.parametrize("normalize", [False, True])
def test_ties_one_expert_density_one_is_task_arithmetic(normalize):
    base, (d,) = _family(1)
    p = {"normalize": normalize, "lambda": 0.7}
    ties = merge_tensor("ties", base, [d], [0.6], params=p)
    ta = merge_tensor("task_arithmetic", base, [d], [0.6], params=p)
    assert torch.equal(ties, ta)


@pytest.mark.parametrize("op", ["dare_linear", "dare_ties"])
def test_dare_density_one_is_its_deterministic_counterpart(op):
    base, deltas = _family()
    p = {"lambda": 0.8, "normalize": False}
    other = "task_arithmetic" if op == "dare_linear" else "ties"
    assert torch.equal(merge_tensor(op, base, deltas, [1.0, 0.5, 2.0], params=p),
                       merge_tensor(other, base, deltas, [1.0, 0.5, 2.0], params=p))


@pytest.mark.parametrize("op", ["linear", "task_arithmetic", "dare_linear"])
def test_omitted_expert_equals_zero_delta_for_additive_ops(op):
    base, deltas = _family()
    w = [1.0, 2.0, 0.5]
    dens = [0.6, 0.6, 0.6]
    omitted = merge_tensor(op, base, deltas, w, densities=dens, omit={1: {0}})
    zero = merge_tensor(op, base, [deltas[0], torch.zeros_like(deltas[1]), deltas[2]], w,
                        densities=dens)
    assert torch.equal(omitted, zero)


@pytest.mark.parametrize("op", ["ties", "dare_ties"])
def test_omitted_expert_equals_zero_delta_for_sign_ops(op):
    base, deltas = _family()
    dens = [0.5] * 3
    trims = [exact_trim(d, 0.5) for d in deltas] if op == "ties" else None
    zero = [deltas[0], torch.zeros_like(deltas[1]), deltas[2]]
    a = merge_tensor(op, base, deltas, [1.0] * 3, densities=dens, omit={1: {0}}, trims=trims)
    b = merge_tensor(op, base, zero, [1.0] * 3, densities=dens, trims=trims)
    assert torch.equal(a, b)


def test_no_expert_read_returns_the_base_unchanged():
    base, deltas = _family()
    for op in OPS:
        out = merge_tensor(op, base, deltas, [1.0] * 3, densities=[0.5] * 3,
                           omit={0: {0}, 1: {0}, 2: {0}})
        assert torch.equal(out, base)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sizes", [[1], [5, 7], [3, 3, 3, 3, 3, 3, 3, 3], [23]])
def test_result_is_the_same_whatever_the_block_split(op, sizes):
    base, deltas = _family(k=4)
    dens = [0.3, 0.5, 0.7, 1.0]
    w, p = [1.0, 0.5, 2.0, 1.5], {"lambda": 0.9}
    whole = merge_tensor(op, base, deltas, w, densities=dens, params=p, seed=11)
    split = merge_tensor(op, base, deltas, w, densities=dens, params=p, seed=11,
                         blocks=row_blocks(24, sizes))
    assert torch.equal(whole, split)


def test_dare_kept_fraction_is_density():
    d = torch.ones(200_000)
    for density in (0.1, 0.5, 0.9):
        keep = drop_mask(expert_key(0, "e", "t"), 0, d.shape, density)
        assert keep is not None
        frac = float(keep.double().mean())
        assert abs(frac - density) < 5 * math.sqrt(density * (1 - density) / d.numel())


def test_dare_mean_over_seeds_is_task_arithmetic():
    base, deltas = _family(shape=(8, 8))
    w = [1.0, 0.5, 2.0]
    ta = merge_tensor("task_arithmetic", base, deltas, w) - base
    n = 2000
    acc = torch.zeros_like(base, dtype=torch.float64)
    for s in range(n):
        acc += merge_tensor("dare_linear", base, deltas, w, densities=[0.5] * 3, seed=s) - base
    mean = acc / n
    # per entry: var of w_i d_i (2 keep - 1) summed over experts; 5 sigma
    sd = torch.sqrt(sum((wi * di.double()) ** 2 for wi, di in zip(w, deltas, strict=True)) / n)
    assert bool(((mean - ta.double()).abs() <= 5 * sd + 1e-7).all())


def test_dare_changes_with_the_seed_and_not_with_anything_else():
    base, deltas = _family()
    a = merge_tensor("dare_ties", base, deltas, [1.0] * 3, densities=[0.5] * 3, seed=1)
    b = merge_tensor("dare_ties", base, deltas, [1.0] * 3, densities=[0.5] * 3, seed=1,
                     blocks=row_blocks(24, [10]))
    c = merge_tensor("dare_ties", base, deltas, [1.0] * 3, densities=[0.5] * 3, seed=2)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_l1_rescale_is_per_block():
    d = torch.arange(1.0, 101.0)
    out = random_drop(d, 0.3, expert_key(0, "e", "t"), 0, "l1")
    assert math.isclose(float(out.abs().sum()), float(d.sum()), rel_tol=1e-6)
    zero = random_drop(torch.zeros(10), 0.3, 1, 0, "l1")
    assert torch.equal(zero, torch.zeros(10))
    with pytest.raises(ValueError):
        random_drop(d, 0.3, 1, 0, "l2")


def test_operators_do_not_modify_their_inputs():
    base, deltas = _family()
    for op in OPS:
        b, ds = base.clone(), [d.clone() for d in deltas]
        experts = [ExpertBlock(i, f"e{i}", ds[i], 1.0, 0.5, exact_trim(ds[i], 0.5), i)
                   for i in range(3)]
        ctx = BlockContext("t", 0, 0, {"lambda": 1.0}, (1.0, 1.0, 1.0))
        out = REGISTRY[op].kernel(b, experts, ctx)
        assert out.dtype == torch.float32 and out.shape == base.shape
        assert torch.equal(b, base) and all(torch.equal(x, y) for x, y in zip(ds, deltas, strict=True))


# -- properties over random cases ----------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(st.data())
def test_split_and_omission_properties(data):
    """Any operator: the same result whatever the row split; an omitted block = a zero delta."""
    op = data.draw(st.sampled_from(OPS))
    k = data.draw(st.integers(1, 4))
    rows, cols = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    base = torch.randn(rows, cols, generator=g)
    deltas = [torch.randn(rows, cols, generator=g) * 0.01 for _ in range(k)]
    if data.draw(st.booleans()):  # bf16-like: many ties and exact zeros
        deltas = [(d * 2**9).round() * 2.0**-9 for d in deltas]
    w = data.draw(st.lists(st.sampled_from([-1.0, 0.25, 0.5, 1.0, 2.0]), min_size=k, max_size=k))
    dens = data.draw(st.lists(st.sampled_from([0.1, 0.3, 0.5, 0.9, 1.0]), min_size=k,
                              max_size=k))
    trims = [exact_trim(d, p) if p < 1 else None for d, p in zip(deltas, dens, strict=True)]
    params = {"lambda": data.draw(st.sampled_from([1.0, 0.5])),
              "normalize": data.draw(st.booleans())}
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6))
    blocks = row_blocks(rows, sizes)

    def run(ds, **kw):
        return merge_tensor(op, base, ds, w, densities=dens, trims=trims, params=params,
                            seed=5, **kw)

    whole = run(deltas)
    assert torch.equal(whole, run(deltas, blocks=blocks))
    omit = {i: set(data.draw(st.lists(st.integers(0, len(blocks) - 1), max_size=3)))
            for i in range(k)}
    zeroed = []
    for i, d in enumerate(deltas):
        z = d.clone()
        for b in omit[i]:
            z[blocks[b][0]:blocks[b][1]] = 0
        zeroed.append(z)
    assert torch.equal(run(deltas, blocks=blocks, omit=omit), run(zeroed, blocks=blocks))
