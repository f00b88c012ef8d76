"""The most common slerp config of mergekit (a global `t` given per tensor: `filter:` entries with
gradients across the layers), nuslerp with per-tensor weights, and linear without `base_model`
(a model soup: mergekit averages the models themselves). Each resolved as mergekit 0.1.5's own
resolver does and merged to mergekit's bytes (one mergekit-yaml subprocess runs every config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mergepipe.catalog.db import Catalog
from tests import catalogs
from tests import geometric_parity as gp
from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")

from mergekit.config import MergeConfiguration, evaluate_setting  # noqa: E402

from mergepipe.core.errors import InvalidRequest  # noqa: E402
from mergepipe.core.mergekit_config import parse_config  # noqa: E402
from mergepipe.jobs.config import load_config  # noqa: E402
from mergepipe.planner.plan import make_plan  # noqa: E402

LAYERS = 5  # layer positions 0, 1/4, 1/2, 3/4, 1
# mergekit's README slerp example: attention and MLP on opposite gradients, the rest at 0.5
T = [{"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
     {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]}, {"value": 0.5}]
MAX_DIFFERING = 4  # as tests/test_geometric_parity.py: reductions summed in another order


def slerp_cfg(fam: dict[str, Path], dtype: str | None = "bfloat16") -> dict[str, Any]:
    return {"merge_method": "slerp", "base_model": str(fam["base"]),
            "models": [{"model": str(fam["base"])}, {"model": str(fam["e0"])}],
            "parameters": {"t": T}, **({"dtype": dtype} if dtype else {})}


def nuslerp_cfg(fam: dict[str, Path]) -> dict[str, Any]:
    return {"merge_method": "nuslerp", "base_model": str(fam["base"]), "dtype": "bfloat16",
            "models": [{"model": str(fam["e0"]), "parameters": {"weight": [
                {"filter": "mlp", "value": [1.0, 0.2]}, {"value": 1.0}]}},
                {"model": str(fam["e1"]), "parameters": {"weight": [0.5, 2.0]}}]}


def soup_cfg(fam: dict[str, Path], weights: list[Any]) -> dict[str, Any]:
    """linear, no base_model: the three experts averaged (no base among them)."""
    return {"merge_method": "linear", "dtype": "float32",
            "models": [{"model": str(fam[n]), "parameters": {"weight": w}}
                       for n, w in zip(mp.EXPERTS, weights, strict=True)]}


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mp.make_family(tmp_path_factory.mktemp("family"), layers=LAYERS)


def _t(tensor: str) -> float:
    parts = tensor.split(".")
    return int(parts[2]) / (LAYERS - 1) if tensor.startswith("model.layers.") else 0.0


def test_slerp_t_per_tensor_is_resolved_as_mergekit_resolves_it(fam, tmp_path):
    """Every tensor's t in the plan is mergekit's own evaluate_setting of the global t; the
    request keeps the setting and its value at unnamed tensors (0.5); the plan hash covers it."""
    cat = Catalog(catalogs.new_catalog(tmp_path))
    try:
        request, resolved = load_config(cat, json.dumps(slerp_cfg(fam)))
        assert request.params["t"] == 0.5
        assert request.params["tensor_params"]["t"] == [[[
            {"filter": "self_attn", "value": [0.0, 0.5, 0.3, 0.7, 1.0]},
            {"filter": "mlp", "value": [1.0, 0.5, 0.7, 0.3, 0.0]},
            {"filter": None, "value": 0.5}]]]
        from mergepipe.jobs.ingest import run_ingestion
        for job in resolved.to_ingest:
            run_ingestion(cat, job)
        plan = make_plan(cat, request)
        setting = MergeConfiguration.model_validate(slerp_cfg(fam)).parameters["t"]
        e0 = request.experts[0].model
        checked = 0
        for tensor in mp.llama_shapes(LAYERS):
            theirs = evaluate_setting(tensor, setting, _t(tensor), validate=float)
            ours = plan.tensor_params.get((e0, tensor), {}).get("t", request.params["t"])
            assert ours == theirs, tensor
            checked += theirs != 0.5
        assert checked > 20  # attention and MLP tensors of every layer but the middle ones
        flat = {**slerp_cfg(fam), "parameters": {"t": 0.5}}
        assert make_plan(cat, load_config(cat, json.dumps(flat))[0]).plan_hash != plan.plan_hash
    finally:
        cat.close()


def test_slerp_t_settings_are_checked_naming_the_key(fam):
    cfg = slerp_cfg(fam)
    cfg["parameters"] = {"t": [{"filter": "mlp", "value": []}]}
    with pytest.raises(InvalidRequest) as e:
        parse_config(json.dumps(cfg))
    assert e.value.field == "parameters.t[0].value"
    cfg["parameters"] = {"lambda": [0.5, 1.0], "t": 0.5}  # slerp takes no lambda: ignored
    assert any("parameters.lambda: ignored" in n for n in parse_config(json.dumps(cfg)).notes)


def test_slerp_t_filters_that_miss_a_tensor_are_mergekits_missing_parameter(fam, tmp_path):
    cfg = {**slerp_cfg(fam), "parameters": {"t": [{"filter": "self_attn", "value": 0.3}]}}
    cat = Catalog(catalogs.new_catalog(tmp_path))
    try:
        request, resolved = load_config(cat, json.dumps(cfg))
        from mergepipe.jobs.ingest import run_ingestion
        for job in resolved.to_ingest:
            run_ingestion(cat, job)
        with pytest.raises(InvalidRequest, match=r"^params\.t: Missing required parameter t "
                                                 r"for (?!\S*self_attn)\S+ ") as e:
            make_plan(cat, request)
        assert e.value.field == "params.t"
    finally:
        cat.close()


def test_a_soup_registers_the_first_single_weight_model_as_the_base(fam, tmp_path):
    """No base_model and unregistered models: the first model with one weight is the base,
    averaged in at its place; the others are its experts (mergekit's inputs, in order)."""
    cat = Catalog(catalogs.new_catalog(tmp_path))
    try:
        request, resolved = load_config(cat, json.dumps(soup_cfg(fam, [[1.0, 2.0], 0.5, 2.0])))
        base_job, *expert_jobs = resolved.to_ingest
        assert base_job.base is None and Path(base_job.path) == fam["e1"].resolve()
        assert [Path(j.path) for j in expert_jobs] == [fam["e0"].resolve(), fam["e2"].resolve()]
        assert all(j.base == base_job.model for j in expert_jobs)
        assert request.base == base_job.model
        assert (request.params["base_weight"], request.params["base_position"]) == (0.5, 1)
        assert [e.model for e in request.experts] == [j.model for j in expert_jobs]
        assert any("model soup" in n for n in resolved.config.notes)
    finally:
        cat.close()
    with pytest.raises(InvalidRequest, match="two models or more") as e:
        parse_config(json.dumps({"merge_method": "linear", "models": [
            {"model": str(fam["e0"]), "parameters": {"weight": 1.0}}]})).as_soup()
    assert e.value.field == "base_model"


@pytest.fixture(scope="module")
def reference(fam, tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    cfgs = {"slerp": slerp_cfg(fam), "slerp-none": slerp_cfg(fam, None),
            "nuslerp": nuslerp_cfg(fam), "soup": soup_cfg(fam, [1.0, 0.5, 2.0]),
            "soup-gradient": soup_cfg(fam, [[1.0, 2.0], 0.5, 2.0])}
    return mp.run_mergekit(cfgs, tmp_path_factory.mktemp("mk"))


@pytest.mark.slow  # a mergekit subprocess (~30 s); make test keeps tests/test_mergekit_parity.py's
def test_slerp_nuslerp_and_soups_give_mergekits_bytes(fam, reference, tmp_path):
    # the soups first, on a catalog where the models are not registered: each model soup
    # registers its own base; then the others, whose experts are then registered too
    cat = Catalog(catalogs.new_catalog(tmp_path))
    try:
        table = {}
        for name, cfg in (("soup", soup_cfg(fam, [1.0, 0.5, 2.0])),
                          ("soup-gradient", soup_cfg(fam, [[1.0, 2.0], 0.5, 2.0])),
                          ("slerp", slerp_cfg(fam)), ("slerp-none", slerp_cfg(fam, None)),
                          ("nuslerp", nuslerp_cfg(fam))):
            summary, ours = mp.run_ours(cat, cfg, tmp_path / "ours" / name)
            table[name] = gp.ulps(ours, reference[name])
            assert summary["expert_bytes_read"] == summary["full_read_bytes"]
        print(json.dumps(table))
        for name, (differ, worst, _) in table.items():
            if name.startswith("soup"):
                assert differ == 0, f"{name}: {table[name]}"
            assert differ <= MAX_DIFFERING and worst <= 1, f"{name}: {table[name]}"
    finally:
        cat.close()


def test_without_base_model_registered_experts_give_the_base_their_peers_join(fam, tmp_path):
    """A registered expert of one base and a new path: the path is registered as an expert of
    that base, which is only the reference of the deltas (not averaged in)."""
    from mergepipe.jobs.ingest import run_ingestion
    cat = Catalog(catalogs.new_catalog(tmp_path))
    try:
        _, resolved = load_config(cat, json.dumps(slerp_cfg(fam)))  # registers base and e0
        for job in resolved.to_ingest:
            run_ingestion(cat, job)
        base, e0 = resolved.base, resolved.experts[0]
        cfg = {"merge_method": "linear", "models": [
            {"model": e0, "parameters": {"weight": 1.0}},
            {"model": str(fam["e1"]), "parameters": {"weight": 3.0}}]}
        request, again = load_config(cat, json.dumps(cfg))
        assert request.base == base and "base_weight" not in request.params
        (job,) = again.to_ingest
        assert job.base == base and Path(job.path) == fam["e1"].resolve()
        assert [e.model for e in request.experts] == [e0, job.model]
    finally:
        cat.close()
