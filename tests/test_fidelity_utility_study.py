"""benchmarks/fidelity/utility_study: the variant scores on hand-computed candidates."""

from __future__ import annotations

import math

import pytest
from mergepipe_bench.fidelity.random_plan import Candidate
from mergepipe_bench.fidelity.utility_study import Norms, variants


def _norms() -> Norms:
    n = Norms.__new__(Norms)
    n.base_block = {("a", 0): 10.0, ("a", 1): 1.0, ("m", 0): 4.0}
    n.base_tensor = {"a": math.sqrt(101.0), "m": 4.0}
    n.delta_tensor = {}
    return n


# expert e: tensor a has two 100-byte blocks (utility 3 and 4: ||D_a|| = 5), tensor m one
# 400-byte block (utility 8).
CANDS = [Candidate("e", "a", 0, 100, 0, 3.0), Candidate("e", "a", 1, 100, 0, 4.0),
         Candidate("e", "m", 0, 400, 0, 8.0)]


def test_variant_scores() -> None:
    v = variants(CANDS, _norms())
    a0, a1, m0 = CANDS
    assert v["relative"](a0) == pytest.approx(3 / 10 / 100)
    assert v["relative"](a1) == pytest.approx(4 / 1 / 100)
    assert v["relative"](m0) == pytest.approx(8 / 4 / 400)
    assert v["tensor-normalized"](a1) == pytest.approx(4 / 5 / 100)
    assert v["tensor-normalized"](m0) == pytest.approx(1 / 400)
    assert v["tensor-energy"](a0) == pytest.approx(9 / 25 / 100)
    assert v["tensor-density"](a0) == pytest.approx(9 / 25 / 100 * 200)
    assert v["tensor-density"](m0) == pytest.approx(1.0)
    assert v["expert-normalized"](m0) == pytest.approx(8 / 15 / 400)
    # whole tensors by ||alpha D_t|| / ||B_t||: m (8 / 4 = 2) before a (5 / sqrt(101))
    assert v["relative-tensor"](m0) > v["relative-tensor"](a1) > v["relative-tensor"](a0)
