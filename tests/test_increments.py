"""The algebra of incremental merges (planner.increments), by hand: c, the changed experts' a_i,
the request the executor runs, the carried bound; no catalog."""

from __future__ import annotations

import pytest

from mergepipe.core.request import MergeRequest, build_request
from mergepipe.planner.increments import (
    Previous,
    carried_bounds,
    find_increment,
    increment_request,
)


def req(experts: str, op: str = "linear", **kw: object) -> MergeRequest:
    return build_request(base="B", experts=experts, operator=op, **kw)  # type: ignore[arg-type]


def prev(request: MergeRequest, bound: float | None = 0.0, budgeted: bool = False) -> Previous:
    return Previous("m-old", "old", request, bound, None, budgeted, "BF16", 0)


def test_adding_an_expert_to_a_normalized_linear_merge() -> None:
    inc = find_increment(prev(req("a,b,c:2")), req("a,b,c:2,d"))
    assert inc is not None
    # alpha_old = (1, 1, 2) / 4, alpha_new = (1, 1, 2, 1) / 5: c = 4/5, d added with 1/5
    assert inc.c == pytest.approx(0.8)
    assert [(ch.model, ch.change) for ch in inc.changes] == [("d", "added")]
    assert inc.changes[0].coefficient == pytest.approx(0.2)


def test_drop_and_reweight() -> None:
    inc = find_increment(prev(req("a,b,c,d")), req("a,b:3,c"))
    assert inc is not None
    # alpha_old = 1/4 each; alpha_new = (1, 3, 1) / 5: c = (1/5) / (1/4) = 4/5 (a and c)
    assert inc.c == pytest.approx(0.8)
    got = {ch.model: (ch.change, ch.coefficient) for ch in inc.changes}
    assert got["b"][0] == "reweighted" and got["b"][1] == pytest.approx(3 / 5 - 0.8 / 4)
    assert got["d"][0] == "dropped" and got["d"][1] == pytest.approx(-0.8 / 4)
    assert set(got) == {"b", "d"}


def test_lambda_alone_rescales_the_stored_merge() -> None:
    old = req("a,b:0.5", "task_arithmetic")
    inc = find_increment(prev(old), req("a,b:0.5", "task_arithmetic", params={"lambda": 2.0}))
    assert inc is not None and inc.c == pytest.approx(2.0) and inc.changes == ()
    assert find_increment(prev(old), old) is None  # nothing changed: the output is there


@pytest.mark.parametrize("new", [
    req("a,b,c", "task_arithmetic"),                                  # another operator
    req("a,b,c", params={"renormalize": "selected"}),                 # another term
    req("x,y"),                                                       # nothing in common
    req("old,a,b"),                                                   # M_old as an expert
])
def test_not_an_increment(new: MergeRequest) -> None:
    assert find_increment(prev(req("a,b")), new) is None


def test_dare_linear_needs_the_same_seed_and_densities() -> None:
    old = req("a:1:0.5,b:1:0.5", "dare_linear", seed=3)
    assert find_increment(prev(old), req("a:1:0.5,b:1:0.5,c:1:0.3", "dare_linear", seed=3))
    assert find_increment(prev(old), req("a:1:0.5,b:1:0.5,c", "dare_linear", seed=4)) is None
    assert find_increment(prev(old), req("a:1:0.6,b:1:0.5,c", "dare_linear", seed=3)) is None


def test_the_executed_request() -> None:
    new = req("a:1:0.5,b:1:0.5,c:1:0.3", "dare_linear", seed=3,
              params={"rescale": "l1", "normalize": True}, output_dtype="F32", budget=0.5)
    inc = find_increment(prev(req("a:1:0.5,b:1:0.5", "dare_linear", seed=3,
                                  params={"rescale": "l1", "normalize": True})), new)
    assert inc is not None
    r = increment_request(new, inc, 1234)
    assert [(e.model, e.density) for e in r.experts] == [("old", 1.0), ("c", 0.3)]
    assert r.weights() == pytest.approx([2 / 3, 1 / 3])
    assert r.coefficients() == pytest.approx(r.weights())  # unnormalized, lambda 1
    assert (r.operator, r.seed, r.output_dtype, r.params["rescale"]) == (
        "dare_linear", 3, "F32", "l1")
    assert r.budget.bytes == 1234


def test_carried_bounds() -> None:
    inc = find_increment(prev(req("a,b"), bound=3.0), req("a,b,c"))
    assert inc is not None and inc.c == pytest.approx(2 / 3)
    total, l2 = carried_bounds(inc, 1.0, 0.5)
    assert total == pytest.approx(1.0 + 2.0) and l2 == pytest.approx(0.5 + 2.0)
    unbounded = find_increment(prev(req("a,b"), bound=None, budgeted=True), req("a,b,c"))
    assert unbounded is not None and carried_bounds(unbounded, 1.0, 0.5) == (None, None)
    assert carried_bounds(inc, None, None) == (None, None)  # no bound of its own
