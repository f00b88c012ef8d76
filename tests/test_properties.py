"""Property tests over random small families, budgets and operators (hypothesis)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mergepipe.catalog.db import Catalog
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.jobs.merge import execute_plan
from mergepipe.planner.plan import make_plan
from tests import factory
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

FAMILIES = {"bf16x3": ("BF16", ("full", "full", "full")),
            "f32x2": ("F32", ("full", "full")),
            "mixed": ("BF16", ("full", "delta", "lora"))}
OPERATORS = ["linear", "task_arithmetic", "ties", "dare_linear", "dare_ties"]


class Families:
    """Families ingested on first use into one catalog shared by all examples."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cat = Catalog(new_catalog(root))
        self.done: set[str] = set()
        self.runs = 0

    def get(self, name: str) -> int:
        dtype, kinds = FAMILIES[name]
        if name not in self.done:
            ingest_family(self.cat, self.root / name, kinds=kinds, dtype=dtype,
                          prefix=f"{name}-", seed=len(self.done) + 1)
            self.done.add(name)
        return len(kinds)

    def out(self) -> Path:
        self.runs += 1
        return self.root / f"out{self.runs}"


@pytest.fixture(scope="module")
def fams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Families]:
    f = Families(tmp_path_factory.mktemp("props"))
    yield f
    f.cat.close()


@st.composite
def requests(draw: st.DrawFn, operators: list[str] = OPERATORS) -> tuple[str, dict]:
    family = draw(st.sampled_from(sorted(FAMILIES)))
    op = draw(st.sampled_from(operators))
    k = len(FAMILIES[family][1])
    weights = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=k, max_size=k))
    params: dict = {}
    if op in ("ties", "dare_linear", "dare_ties"):
        params["density"] = draw(st.sampled_from([0.2, 0.5, 0.9]))
    if op == "task_arithmetic":
        params["lambda"] = draw(st.sampled_from([0.5, 1.0]))
    return family, {"experts": ",".join(f"{family}-e{i}:{w}" for i, w in enumerate(weights)),
                    "operator": op, "params": params,
                    "seed": draw(st.integers(0, 2**31)),
                    "budget": draw(st.floats(0.02, 1.0))}


def _request(family: str, spec: dict, **over: object) -> MergeRequest:
    return build_request(base=f"{family}-base", **{**spec, **over})


def _l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(((a[n].double() - b[n].double()) ** 2).sum()) for n in a))


SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@SETTINGS
@given(req=requests())
def test_budget_soundness_and_monotonicity(fams: Families, req: tuple[str, dict]) -> None:
    family, spec = req
    fams.get(family)
    small = make_plan(fams.cat, _request(family, spec))
    larger = make_plan(fams.cat, _request(family, spec, budget=min(1.0, spec["budget"] * 1.5)))
    assert larger.planned_expert_bytes >= small.planned_expert_bytes
    r = execute_plan(fams.cat, small, fams.out()).to_dict()
    assert r["expert_bytes_read"] == r["planned_expert_bytes"] <= r["budget_bytes"]
    assert r["budget_bytes"] == math.floor(spec["budget"] * r["full_read_bytes"])


@SETTINGS
@given(req=requests(["linear", "task_arithmetic"]))
def test_omission_bound_holds_for_additive_operators(fams: Families,
                                                    req: tuple[str, dict]) -> None:
    family, spec = req
    fams.get(family)
    budgeted = execute_plan(fams.cat, make_plan(fams.cat, _request(family, spec,
                                                                   output_dtype="F32")),
                            fams.out()).to_dict()
    full = execute_plan(fams.cat, make_plan(fams.cat, _request(family, spec, budget=1.0,
                                                               output_dtype="F32")),
                        fams.out()).to_dict()
    m_a, m_full = factory.load(Path(budgeted["output"])), factory.load(Path(full["output"]))
    deviation = _l2(m_full, m_a)
    scale = math.sqrt(sum(float((t.double() ** 2).sum()) for t in m_full.values()))
    # realized <= omission_bound_l2 (blocks in quadrature) <= omission_bound (DESIGN)
    assert deviation <= budgeted["omission_bound_l2"] + 1e-6 * scale + 1e-6
    assert budgeted["omission_bound_l2"] <= budgeted["omission_bound"]
    assert deviation <= budgeted["omission_bound"] + 1e-6 * scale + 1e-6
    assert full["omission_bound"] == pytest.approx(0.0, abs=1e-9)
    assert full["omission_bound_l2"] == pytest.approx(0.0, abs=1e-9)


@SETTINGS
@given(req=requests())
def test_same_request_same_plan_and_output(fams: Families, req: tuple[str, dict]) -> None:
    family, spec = req
    fams.get(family)
    a = execute_plan(fams.cat, make_plan(fams.cat, _request(family, spec)), fams.out(),
                     threads=1).to_dict()
    b = execute_plan(fams.cat, make_plan(fams.cat, _request(family, spec)), fams.out(),
                     threads=4).to_dict()
    assert a["plan_hash"] == b["plan_hash"]
    assert a["output_hash"] == b["output_hash"]
