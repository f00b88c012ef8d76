"""Adding an operator is one spec and one registry line: a toy operator, registered here, goes
through validation, planning (with its own coefficients in the bound), the merge, the model card
and a mergekit YAML config without any other change."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import torch

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_config import parse_config
from mergepipe.core.operators import (
    REGISTRY,
    BlockContext,
    ExpertBlock,
    MergekitMethod,
    OperatorSpec,
    Param,
    register,
    unregister,
)
from mergepipe.core.request import build_request
from mergepipe.executor.model_card import mergekit_config, render_model_card
from mergepipe.jobs.config import load_config
from mergepipe.jobs.merge import merge
from mergepipe.jobs.planning import plan_merge
from tests import factory
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family


def _half_sum(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext
              ) -> torch.Tensor:
    """M = B + lambda * factor * sum_i w_i D_i over the experts read."""
    out = base.clone()
    for e in experts:
        if e.delta is not None:
            out += ctx.lam * float(ctx.params["factor"]) * e.weight * e.delta
    return out


def _coefficients(weights: Sequence[float], params: Mapping[str, object]) -> list[float]:
    lam, factor = float(params["lambda"]), float(params["factor"])  # type: ignore[arg-type]
    return [lam * factor * w for w in weights]


TOY = OperatorSpec(
    name="toy_scaled_sum", title="toy scaled-sum", formula="M = B + lambda * factor * sum w_i D_i",
    kernel=_half_sum, normalize_default=False, additive=True,
    params=(Param("factor", float, 0.5, help="scale of every delta"),),
    aliases=("toy",), coefficients=_coefficients,
    mergekit=MergekitMethod("toy_scaled_sum", params={"lambda": "lambda", "factor": "factor"}))


@pytest.fixture
def toy() -> Iterator[OperatorSpec]:
    register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY.name)
    assert TOY.name not in REGISTRY


@pytest.fixture
def family(tmp_path: Path) -> Iterator[tuple[Catalog, dict[str, Path]]]:
    with Catalog(new_catalog(tmp_path, "cat")) as cat:
        yield cat, ingest_family(cat, tmp_path / "fam", dtype="F32")


def test_the_spec_drives_validation(toy: OperatorSpec) -> None:
    req = build_request(base="base", experts="e0,e1:2", operator="TOY", params={"factor": 0.25})
    assert req.operator == "toy_scaled_sum" and req.spec is toy
    assert req.params == {"normalize": False, "lambda": 1.0, "factor": 0.25}
    assert req.coefficients() == [0.25, 0.5]
    with pytest.raises(InvalidRequest) as e:
        build_request(base="base", experts="e0", operator="toy", params={"factor": "big"})
    assert e.value.field == "params.factor"
    with pytest.raises(InvalidRequest) as e:
        build_request(base="base", experts="e0", operator="toy", params={"density": 0.5})
    assert e.value.field == "density"  # the spec says it does not sparsify


def test_plan_merge_and_model_card(toy: OperatorSpec, family, tmp_path: Path) -> None:
    cat, paths = family
    req = build_request(base="base", experts="e0,e1:2", operator="toy", params={"factor": 0.25},
                        budget=0.5)
    plan = plan_merge(cat, req)
    assert 0 < plan.planned_expert_bytes <= plan.budget_bytes
    # the bound sums |alpha_i| * ||D_itb|| over the omitted blocks, alpha from the spec
    alpha = {"e0": 0.25, "e1": 0.5}
    read = {(b.model, b.tensor, b.block_index) for b in plan.blocks}
    rows = cat.query(SQL("SELECT model, tensor, block_index, l2 FROM block_stats "
                             "WHERE model IN ('e0', 'e1')"))
    omitted = math.fsum(alpha[r.model] * r.l2 for r in rows
                        if (r.model, r.tensor, r.block_index) not in read)
    assert omitted > 0 and plan.omission_bound == pytest.approx(omitted, rel=1e-9)
    full = build_request(base="base", experts="e0,e1:2", operator="toy",
                         params={"factor": 0.25})
    summary = merge(cat, full, tmp_path / "out")
    base = factory.load(paths["base"])
    e0, e1 = factory.load(paths["e0"]), factory.load(paths["e1"])
    got = factory.load(tmp_path / "out")
    for name, b in base.items():
        want = b + 0.25 * (e0[name] - b) + 0.5 * (e1[name] - b)
        assert torch.allclose(got[name], want, atol=1e-6), name
    card = (tmp_path / "out" / "README.md").read_text()
    assert "A toy scaled-sum merge of 2 experts" in card
    assert "merge_method: toy_scaled_sum" in card and "factor: 0.25" in card
    assert summary.operator == "toy_scaled_sum" and summary.omission_bound == 0.0
    assert render_model_card(full, {}).startswith("---\n")


def test_mergekit_yaml_round_trip(toy: OperatorSpec, family) -> None:
    cat, _ = family
    text = ("merge_method: toy_scaled_sum\nbase_model: base\nmodels:\n"
            "  - {model: e0, parameters: {weight: 1.0}}\n"
            "  - {model: e1, parameters: {weight: 2.0}}\n"
            "parameters: {factor: 0.25, lambda: 2.0}\n")
    assert parse_config(text).operator == "toy_scaled_sum"
    req, resolved = load_config(cat, text)
    assert resolved.to_ingest == [] and req.params["factor"] == 0.25
    assert req.coefficients() == [0.5, 1.0] and math.isclose(req.params["lambda"], 2.0)
    config = mergekit_config(req)
    assert config is not None and "merge_method: toy_scaled_sum" in config
    again, _ = load_config(cat, config.replace("dtype: float32\n", ""))
    assert again == req
