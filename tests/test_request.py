"""Merge request validation: what makes no sense is refused with the offending field named."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.request import Budget, build_request, parse_experts


def req(**kw):
    args: dict[str, Any] = {"base": "b", "experts": "e1,e2", "operator": "linear"}
    args.update(kw)
    return build_request(**args)


def test_defaults_follow_mergekit():
    assert req().params["normalize"] is True
    assert req(operator="task_arithmetic").params["normalize"] is False
    assert req(operator="ties").params["normalize"] is True
    assert req(operator="dare_ties").params == {"normalize": False, "lambda": 1.0,
                                                "rescale": "density"}
    assert req(operator="avg").operator == "linear"


def test_expert_syntax():
    specs = parse_experts("e1, e2:0.5 ,e3:2:0.7")
    assert [(e.model, e.weight, e.density) for e in specs] == [
        ("e1", 1.0, None), ("e2", 0.5, None), ("e3", 2.0, 0.7)]
    r = build_request(base="b", experts=[{"model": "x", "weight": 3}], operator="ties",
                      params={"density": 0.3})
    assert r.densities() == [0.3]


def test_coefficients():
    r = req(experts="a:1,c:3")
    assert r.coefficients() == [0.25, 0.75]
    r = req(experts="a:1,c:3", operator="task_arithmetic", params={"lambda": 0.5})
    assert r.coefficients() == [0.5, 1.5]


@pytest.mark.parametrize("budget,expected", [
    (None, Budget(fraction=1.0)), ("0.3", Budget(fraction=0.3)), (0.3, Budget(fraction=0.3)),
    ("2GiB", Budget(bytes=2 * 2**30)), ("500MB", Budget(bytes=500 * 10**6)),
    ("1234B", Budget(bytes=1234)), ({"bytes": 10}, Budget(bytes=10)),
    ({"fraction": 1}, Budget(fraction=1)),
])
def test_budget_forms(budget, expected):
    assert Budget.parse(budget) == expected


def test_budget_resolution():
    assert Budget(fraction=0.5).resolve(1001) == 500
    assert Budget(bytes=7).resolve(10**9) == 7


@pytest.mark.parametrize("kw,field", [
    ({"operator": "frobnicate"}, "operator"),
    ({"budget": 0}, "budget.fraction"),
    ({"budget": -0.1}, "budget.fraction"),
    ({"budget": math.nan}, "budget.fraction"),
    ({"budget": "inf"}, "budget.fraction"),
    ({"budget": 1.5}, "budget.fraction"),  # a share of the full read: above 1 means nothing
    ({"budget": {"bytes": 0}}, "budget.bytes"),
    ({"budget": {"fraction": 0.5, "bytes": 3}}, "budget"),
    ({"budget": "12 parsecs"}, "budget"),
    ({"budget": True}, "budget"),
    ({"operator": "ties", "params": {"density": 0}}, "params.density"),
    ({"operator": "ties", "params": {"density": 1.5}}, "params.density"),
    ({"operator": "ties", "experts": [{"model": "a", "density": -1}]}, "experts[0].density"),
    ({"operator": "ties", "params": {"density": 0.555}}, "density"),
    ({"experts": "a:1,b:-1"}, "experts"),
    ({"experts": "a,a"}, "experts"),
    ({"experts": "b"}, "experts"),
    ({"experts": ""}, "experts"),
    ({"experts": "a:x"}, "experts"),
    ({"params": {"density": 0.5}}, "density"),
    ({"params": {"bogus": 1}}, "params"),
    ({"params": {"lambda": math.inf}}, "params.lambda"),
    ({"operator": "ties", "params": {"rescale": "l1"}}, "params.rescale"),
    ({"operator": "dare_linear", "params": {"rescale": "l3"}}, "params.rescale"),
    ({"params": {"renormalize": "sometimes"}}, "params.renormalize"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"output_dtype": "int8"}, "output_dtype"),
    ({"base": ""}, "base"),
])
def test_rejections_name_the_field(kw, field):
    with pytest.raises(InvalidRequest) as e:
        req(**kw)
    assert e.value.field == field
    assert e.value.status == 422


def test_round_trip_to_dict():
    r = req(operator="ties", params={"density": 0.5}, budget="1MiB", seed=7, output_dtype="bf16")
    d = r.to_dict()
    assert d["budget"] == {"bytes": 2**20}
    assert d["output_dtype"] == "BF16"
    r2 = build_request(base=d["base"], experts=d["experts"], operator=d["operator"],
                       params=d["params"], budget=d["budget"], seed=d["seed"],
                       output_dtype=d["output_dtype"])
    assert r2 == r
