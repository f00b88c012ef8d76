"""The whole-tensor kernels (slerp, nuslerp, model_stock) on hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.operators import REGISTRY, BlockContext, ExpertBlock
from mergepipe.core.request import build_request

R = 1 / math.sqrt(2)


def run(op: str, base: list[float], experts: list[list[float]], weights: list[float] | None = None,
        **params: object) -> torch.Tensor:
    b = torch.tensor(base)
    ws = weights or [1.0] * len(experts)
    blocks = [ExpertBlock(i, f"e{i}", torch.tensor(x) - b, ws[i], 1.0, None, i)
              for i, x in enumerate(experts)]
    return REGISTRY[op].kernel(b, blocks, BlockContext("t", 0, 0, dict(params), tuple(ws)))


def test_slerp_follows_the_arc_and_falls_back_to_lerp():
    out = run("slerp", [1.0, 0.0], [[0.0, 1.0]], t=0.5)  # a quarter circle: its midpoint
    assert torch.allclose(out, torch.tensor([R, R]), atol=1e-6)
    out = run("slerp", [1.0, 0.0], [[0.0, 3.0]], t=0.5)  # the unnormalized inputs are scaled
    assert torch.allclose(out, torch.tensor([R, 3 * R]), atol=1e-6)
    out = run("slerp", [1.0, 2.0], [[2.0, 4.0]], t=0.25)  # parallel: (1 - t) B + t X
    assert torch.equal(out, torch.tensor([1.25, 2.5]))


def test_nuslerp_interpolates_the_deltas_by_the_weights():
    out = run("nuslerp", [5.0, 5.0], [[6.0, 5.0], [5.0, 6.0]], [1.0, 1.0])
    assert torch.allclose(out, torch.tensor([5 + R, 5 + R]), atol=1e-6)
    out = run("nuslerp", [0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]], [2.0, 1.0])  # t = 1/3
    assert torch.allclose(out, torch.tensor([math.cos(math.pi / 6), math.sin(math.pi / 6)]),
                          atol=1e-6)
    # per row of the last dimension: each row has its own angle (orthogonal, then parallel)
    rows = run("nuslerp", [0.0] * 4, [[1.0, 0.0, 2.0, 2.0], [0.0, 1.0, 2.0, 2.0]], [1.0, 1.0],
               flatten=False)
    b = torch.zeros(2, 2)
    blocks = [ExpertBlock(i, f"e{i}", torch.tensor(x).reshape(2, 2), 1.0, 1.0, None, i)
              for i, x in enumerate([[1.0, 0.0, 2.0, 2.0], [0.0, 1.0, 2.0, 2.0]])]
    per_row = REGISTRY["nuslerp"].kernel(b, blocks, BlockContext("t", 0, 0, {"flatten": False}))
    assert torch.allclose(per_row, torch.tensor([[R, R], [2.0, 2.0]]), atol=1e-6)
    assert not torch.allclose(rows, per_row.reshape(-1))  # one vector: one angle


def test_model_stock_weighs_the_average_by_the_angle():
    # orthogonal deltas: cos 0, t 0 -> the base; equal deltas: cos 1, t = 2/2 -> the average
    assert torch.equal(run("model_stock", [1.0, 1.0], [[2.0, 1.0], [1.0, 2.0]]),
                       torch.tensor([1.0, 1.0]))
    assert torch.equal(run("model_stock", [1.0, 1.0], [[2.0, 3.0], [2.0, 3.0]]),
                       torch.tensor([2.0, 3.0]))
    # cos 1/2 with three experts: mean cos of the pairs; t = 3 c / (1 + 2 c)
    out = run("model_stock", [0.0, 0.0], [[1.0, 0.0], [0.5, math.sqrt(3) / 2], [1.0, 0.0]])
    cos = (0.5 + 1.0 + 0.5) / 3
    t = 3 * cos / (1 + 2 * cos)
    avg = torch.tensor([2.5 / 3, math.sqrt(3) / 6])
    assert torch.allclose(out, t * avg, atol=1e-6)


@pytest.mark.parametrize("op,k", [("slerp", 1), ("nuslerp", 2), ("model_stock", 3)])
def test_kernels_keep_their_inputs_and_an_unread_expert_is_the_base(op, k):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 4, generator=g)
    deltas = [torch.randn(6, 4, generator=g) * 0.1 for _ in range(k)]
    b, ds = base.clone(), [d.clone() for d in deltas]
    experts = [ExpertBlock(i, f"e{i}", ds[i], 1.0, 1.0, None, i) for i in range(k)]
    ctx = BlockContext("t", 0, 0, {"t": 0.3}, (1.0,) * k)
    out = REGISTRY[op].kernel(b, experts, ctx)
    assert out.dtype == torch.float32 and out.shape == base.shape
    assert torch.equal(b, base) and all(torch.equal(x, y) for x, y in zip(ds, deltas,
                                                                          strict=True))
    unread = [ExpertBlock(i, f"e{i}", None, 1.0, 1.0, None, i) for i in range(k)]
    zero = [ExpertBlock(i, f"e{i}", torch.zeros_like(base), 1.0, 1.0, None, i)
            for i in range(k)]
    assert torch.equal(REGISTRY[op].kernel(base, unread, ctx),
                       REGISTRY[op].kernel(base, zero, ctx))


@pytest.mark.parametrize("op,experts,params", [
    ("slerp", [{"model": "e0"}], {"t": 0.3}),
    ("nuslerp", [{"model": "e0", "weight": 1.0}, {"model": "e1", "weight": 0.5}],
     {"row_wise": True, "flatten": False}),
    ("model_stock", [{"model": "e0"}, {"model": "e1"}], {"filter_wise": True})])
def test_the_model_cards_mergekit_config_reads_back_as_the_request(op, experts, params):
    from mergepipe.core.mergekit_config import parse_config
    from mergepipe.core.request import build_request
    from mergepipe.executor.model_card import mergekit_config

    req = build_request(base="b", experts=experts, operator=op, params=params)
    text = mergekit_config(req)
    assert text is not None
    cfg = parse_config(text)
    assert cfg.operator == op and cfg.compute_dtype == "float32"
    assert [e.ref.text for e in cfg.experts] == [e["model"] for e in experts]
    assert [e.weight for e in cfg.experts] == [e.weight for e in req.experts]
    assert {k: cfg.params[k] for k in params} == params
    assert not any("ignored" in n for n in cfg.notes)


@pytest.mark.parametrize("op", ["slerp", "nuslerp", "model_stock"])
@pytest.mark.parametrize("params", [{"lambda": 0.5}, {"normalize": True}])
def test_scale_parameters_they_would_ignore_are_refused(op: str, params: dict) -> None:
    experts = ",".join(["e0", "e1", "e2"][:REGISTRY[op].experts_count[1] or 3])
    with pytest.raises(InvalidRequest, match=f"takes no {next(iter(params))}") as e:
        build_request(base="base", experts=experts, operator=op, params=params)
    assert e.value.field == f"params.{next(iter(params))}"
    build_request(base="base", experts=experts, operator=op, params={"lambda": 1.0})
