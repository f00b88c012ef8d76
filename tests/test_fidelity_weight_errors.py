"""The ranking study's weight-space distance to the full merge (benchmarks.fidelity.evaluate
.weight_errors), hand-computed on two tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from mergepipe_bench.fidelity.evaluate import weight_errors  # noqa: E402


def test_both_distances_by_hand() -> None:
    base = {"a": torch.zeros(2), "b": torch.ones(2), "same": torch.ones(3)}
    # updates: a by (3, 4) (squared norm 25), b by (1, 0) (squared norm 1); `same` unchanged
    full = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([2.0, 1.0]),
            "same": torch.ones(3)}
    # the plan misses a's second entry (error 16) and all of b's update (error 1)
    plan = {"a": torch.tensor([3.0, 0.0]), "b": torch.ones(2), "same": torch.full((3,), 9.0)}
    w = weight_errors(plan, full, base)
    assert w["rel_l2"] == pytest.approx((17 / 26) ** 0.5)
    # a tensor the full merge does not change is left out: mean of 16/25 and 1/1
    assert w["tensor_rel"] == pytest.approx((16 / 25 + 1.0) / 2)
    assert weight_errors(full, full, base) == {"rel_l2": 0.0, "tensor_rel": 0.0}
