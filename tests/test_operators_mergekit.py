"""Tensor-level conformance of the operators with mergekit's own merge methods (in process)."""

from __future__ import annotations

import pytest
import torch

from mergepipe.core.operators.keyed_hash import expert_key, uniform
from tests.operator_helpers import exact_trim, merge_tensor, row_blocks

registry = pytest.importorskip("mergekit.merge_methods.registry",
                               reason="mergekit (test extra) is not installed")
TensorGroup = pytest.importorskip("mergekit.merge_methods.base").TensorGroup

SHAPE = (48, 40)
W = [1.0, 0.5, 2.0]


def _family(seed: int, quantized: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A float32 base and three deltas; `quantized` makes them bf16 fine-tune-like (many ties)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(SHAPE, generator=g) * 0.05
    experts = [base + torch.randn(SHAPE, generator=g) * 0.002 * (i + 1) for i in range(3)]
    if quantized:
        base = base.bfloat16().float()
        experts = [e.bfloat16().float() for e in experts]
    return base, [e - base for e in experts]


def _mergekit(method: str, base: torch.Tensor, deltas: list[torch.Tensor],
              weights: list[float], params: dict[str, object],
              density: list[float] | None = None) -> torch.Tensor:
    """mergekit's method on one tensor group (the base first, then base + delta_i)."""
    params = dict(params)
    tensors = [base] + ([base + d for d in deltas])
    if method == "linear":  # linear ignores the base: average the experts themselves
        group = TensorGroup.from_tensors(tensors[1:])
        params["weight"] = dict(enumerate(weights))
    else:
        group = TensorGroup.from_tensors(tensors, base_index=0)
        params["weight"] = {i + 1: w for i, w in enumerate(weights)}
        if density is not None:
            params["density"] = {i + 1: p for i, p in enumerate(density)}
    (out,) = registry.get(method)([group], parameters=params)
    return out


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("lam", [1.0, 0.7])
def test_task_arithmetic_is_bitwise_mergekit(normalize, lam):
    base, deltas = _family(0, quantized=False)
    ours = merge_tensor("task_arithmetic", base, deltas, W,
                        params={"normalize": normalize, "lambda": lam},
                        blocks=row_blocks(SHAPE[0], [7, 20]))
    theirs = _mergekit("task_arithmetic", base, deltas, W, {"normalize": normalize, "lambda": lam})
    assert torch.equal(ours, theirs)


def test_linear_matches_mergekit_within_float32_rounding():
    # mergekit averages the experts, sum(w_i E_i) / sum(w); we add the averaged deltas to the
    # base, B + sum(w_i D_i) / sum(w): equal in exact arithmetic, a few float32 ulps apart.
    base, deltas = _family(1, quantized=True)
    ours = merge_tensor("linear", base, deltas, W, params={"normalize": True, "lambda": 1.0})
    theirs = _mergekit("linear", base, deltas, W, {"normalize": True})
    # elementwise: a few roundings of the magnitudes the two formulas add up
    scale = base.abs() + sum(abs(w) / sum(W) * (base + d).abs() for w, d in zip(W, deltas, strict=True))
    assert bool(((ours - theirs).abs() <= 4 * torch.finfo(torch.float32).eps * scale).all())
    assert not torch.equal(ours, theirs)  # the formulas do differ in rounding


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_ties_is_bitwise_mergekit_off_the_threshold(quantized, normalize):
    base, deltas = _family(2, quantized=quantized)
    dens = [0.3, 0.5, 0.71]
    trims = [exact_trim(d, p) for d, p in zip(deltas, dens, strict=True)]
    ours = merge_tensor("ties", base, deltas, W, densities=dens, trims=trims,
                        params={"normalize": normalize, "lambda": 0.9},
                        blocks=row_blocks(SHAPE[0], [5, 11, 16]))
    theirs = _mergekit("ties", base, deltas, W, {"normalize": normalize, "lambda": 0.9}, dens)
    # entries tied at an expert's threshold, where mergekit's pick is an arbitrary argsort
    tied = torch.zeros(SHAPE, dtype=torch.bool)
    for d, t in zip(deltas, trims, strict=True):
        if t.above + t.tied > t.k:
            tied |= d.abs() == t.tau
    if quantized:
        assert int(tied.sum()) > 50  # the case the tie rule exists for
    else:
        assert int(tied.sum()) == 0
    assert torch.equal(ours[~tied], theirs[~tied])


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_with_our_masks_is_bitwise_mergekit(method, monkeypatch):
    """mergekit draws with torch.bernoulli; hand it our keyed masks, rescale l1 on one block."""
    base, deltas = _family(3, quantized=True)
    dens = [0.3, 0.5, 0.9]
    seed = 4
    masks = iter([(uniform(expert_key(seed, f"e{i}", "t"), 0, SHAPE) < p).float()
                  for i, p in enumerate(dens)])
    monkeypatch.setattr(torch, "bernoulli", lambda probs: next(masks))
    theirs = _mergekit(method, base, deltas, W, {"rescale": True, "normalize": True}, dens)
    ours = merge_tensor(method, base, deltas, W, densities=dens, seed=seed,
                        params={"rescale": "l1", "normalize": True})
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_density_one_is_bitwise_mergekit(method):
    base, deltas = _family(5, quantized=False)
    ours = merge_tensor(method, base, deltas, W, densities=[1.0] * 3,
                        params={"lambda": 1.3}, blocks=row_blocks(SHAPE[0], [9]))
    theirs = _mergekit(method, base, deltas, W, {"lambda": 1.3, "rescale": True})
    assert torch.equal(ours, theirs)
