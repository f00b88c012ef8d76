"""Per-tensor parameters of mergekit configs: gradients (lists interpolated across the layers) and
`filter:` values, global and per model, resolved per tensor as mergekit 0.1.5's resolver does,
used by the planner and the executor, and shown in the manifest. Conformance: the same configs
run by mergekit-yaml (one subprocess) and by MergePipe give the same bytes (TIES: off the entries
tied at an expert's trim threshold at that tensor's density).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")

from mergekit.config import MergeConfiguration, evaluate_setting  # noqa: E402

from mergepipe.core.errors import InvalidRequest  # noqa: E402
from mergepipe.core.mergekit_config import parse_config  # noqa: E402
from mergepipe.core.tensor_params import layer_counts, layer_t, resolve  # noqa: E402

LAYERS = 5  # t = 0, 1/4, 1/2, 3/4, 1: gradients take values between their endpoints
COMPUTE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           None: torch.bfloat16}
ATTN_MLP = [{"filter": "self_attn", "value": 0.25}, {"filter": "mlp", "value": [0.5, 1.5]},
            {"value": 1.0}]


def _models(fam: dict[str, Path], params: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"model": str(fam[n]), **({"parameters": p} if p else {})}
            for n, p in zip(mp.EXPERTS, params, strict=True)]


def ta_gradient(fam: dict[str, Path], dtype: str | None) -> dict[str, Any]:
    """Per-model gradient, per-model filters (one a gradient), a scalar; global lambda."""
    return {"merge_method": "task_arithmetic", "base_model": str(fam["base"]),
            "models": _models(fam, [{"weight": [1.0, 0.5, 2.0]}, {"weight": ATTN_MLP},
                                    {"weight": 2.0}]),
            "parameters": {"lambda": 0.6}, **({"dtype": dtype} if dtype else {})}


def ties_gradient(fam: dict[str, Path], dtype: str | None) -> dict[str, Any]:
    """Global density gradient; a per-model filter without a default (falls back to it); a
    scalar; weight gradient and filters."""
    return {"merge_method": "ties", "base_model": str(fam["base"]),
            "models": _models(fam, [
                {"weight": [1.0, 2.0]},
                {"weight": 0.5, "density": [{"filter": "mlp", "value": 0.5}]},
                {"weight": [{"filter": "self_attn", "value": 1.5}, {"value": 2.0}],
                 "density": 0.7}]),
            "parameters": {"density": [0.3, 0.7]}, **({"dtype": dtype} if dtype else {})}


def linear_filter(fam: dict[str, Path], dtype: str | None) -> dict[str, Any]:
    """Global filtered weight, one model's gradient over it, one scalar; the base at weight 0."""
    cfg = {"merge_method": "linear", "base_model": str(fam["base"]),
           "models": [{"model": str(fam["base"]), "parameters": {"weight": 0.0}},
                      *_models(fam, [{}, {"weight": 0.5}, {"weight": [0.5, 2.0]}])],
           "parameters": {"weight": [{"filter": "self_attn", "value": 0.5}, {"value": 1.0}]}}
    return {**cfg, **({"dtype": dtype} if dtype else {})}


CONFIGS = {"ta": ta_gradient, "ties": ties_gradient, "linear": linear_filter}
FAST = {"ta-bfloat16": ("ta", "bfloat16"), "ties-bfloat16": ("ties", "bfloat16"),
        "linear-float32": ("linear", "float32")}
SLOW = {f"{c}-{d or 'none'}": (c, d) for c in CONFIGS
        for d in ("bfloat16", "float16", None, "float32")}


def mergekit_value(cfg: dict[str, Any], i: int, name: str, tensor: str, t: float) -> Any:
    """mergekit's own resolution of model i's parameter at a tensor (its config classes)."""
    mc = MergeConfiguration.model_validate(cfg)
    scopes = [mc.models[i].parameters, mc.parameters]
    for scope in scopes:
        if scope and name in scope:
            v = evaluate_setting(tensor, scope[name], t, validate=float)
            if v is not None:
                return v
    return None


def _t(tensor: str) -> float:
    m = re.match(r"model\.layers\.(\d+)\.", tensor)
    return int(m.group(1)) / (LAYERS - 1) if m else 0.0  # mergekit: pre/post weights at t=0


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return mp.make_family(tmp_path_factory.mktemp("family5"), layers=LAYERS)


def test_resolution_is_mergekits_at_every_tensor(fam):
    """Our chains (the model's setting, then the global one) give mergekit's value at every
    tensor of the family, for every config above; t is mergekit's layer position."""
    names = list(mp.llama_shapes(LAYERS))
    counts = layer_counts(names)
    checked = 0
    for make in CONFIGS.values():
        cfg = make(fam, "bfloat16")
        parsed = parse_config(json.dumps(cfg))
        offset = 1 if cfg["merge_method"] == "linear" else 0  # the base listed first
        for i, e in enumerate(parsed.experts):
            for name in ("weight", "density"):
                if name == "density" and cfg["merge_method"] != "ties":
                    continue
                for tensor in names:
                    assert layer_t(tensor, counts) == _t(tensor)
                    chain = e.chains.get(name)
                    ours = (resolve(chain, tensor, _t(tensor)) if chain is not None
                            else getattr(e, name))
                    theirs = mergekit_value(cfg, i + offset, name, tensor, _t(tensor))
                    assert ours == (1.0 if theirs is None and name == "density" else theirs), (
                        cfg["merge_method"], i, name, tensor)
                    checked += 1
    assert checked > 300


def _density_of(cfg: dict[str, Any], i: int):
    return lambda tensor: mergekit_value(cfg, i, "density", tensor, _t(tensor)) or 1.0


def _check(name: str, fam, cat, theirs, out: Path) -> dict:
    kind, dtype = (FAST | SLOW)[name]
    cfg = CONFIGS[kind](fam, dtype)
    summary, ours = mp.run_ours(cat, cfg, out)
    keep = (mp.untied(fam, COMPUTE[dtype], tuple(_density_of(cfg, i) for i in range(3)))
            if kind == "ties" else None)
    differ, compared, rel = mp.differences(ours, theirs, keep)
    assert differ == 0, f"{name}: {differ} of {compared} entries differ (rel L2 {rel:.2e})"
    assert compared > 0.95 * sum(t.numel() for t in theirs.values())
    return summary


@pytest.fixture(scope="module")
def reference(fam, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk")
    return mp.run_mergekit({n: CONFIGS[c](fam, d) for n, (c, d) in FAST.items()}, root)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ours")


@pytest.mark.slow  # a mergekit subprocess (~30 s); make test keeps tests/test_mergekit_parity.py's
@pytest.mark.parametrize("name", list(FAST))
def test_gradients_and_filters_give_mergekits_bytes(name, fam, cat, reference, outputs):
    _check(name, fam, cat, reference[name], outputs / name)


def test_the_manifest_shows_the_per_tensor_values_where_they_differ(fam, cat, outputs):
    out = outputs / "ta-bfloat16"  # the parity run's output
    if not out.exists():
        mp.run_ours(cat, ta_gradient(fam, "bfloat16"), out)
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {(r["model"], r["tensor"]): r for r in manifest["plan"]["tensor_params"]}
    experts = {e["model"]: e for e in manifest["experts"]}
    e0, e1 = (manifest["request"]["experts"][i]["model"] for i in (0, 1))
    assert experts[e0]["weight"] == 1.0 and experts[e1]["weight"] == 1.0  # at layer 0, unfiltered
    # e0's gradient [1, 0.5, 2]: 0.75, 0.5, 1.25, 2 at layers 1..4; layer 0 and the rest: 1
    for layer, w in ((1, 0.75), (2, 0.5), (3, 1.25), (4, 2.0)):
        assert rows[(e0, f"model.layers.{layer}.self_attn.q_proj.weight")] == {
            "model": e0, "tensor": f"model.layers.{layer}.self_attn.q_proj.weight", "weight": w}
    assert (e0, "model.layers.0.mlp.up_proj.weight") not in rows
    assert (e0, "lm_head.weight") not in rows
    # e1's filters: attention 0.25, MLP the gradient [0.5, 1.5], the rest 1 (not listed)
    assert rows[(e1, "model.layers.0.self_attn.k_proj.weight")]["weight"] == 0.25
    assert (e1, "model.layers.2.mlp.down_proj.weight") not in rows  # 1.0 there: as its default
    assert rows[(e1, "model.layers.4.mlp.down_proj.weight")]["weight"] == 1.5
    assert (e1, "model.layers.2.input_layernorm.weight") not in rows
    assert not any(m == manifest["request"]["experts"][2]["model"] for m, _ in rows)  # scalar
    # the request keeps the settings; the plan hash covers the resolved values
    assert manifest["request"]["params"]["tensor_params"]["weight"][2] is None
    assert manifest["plan_hash"] == _plan(cat, ta_gradient(fam, "bfloat16")).plan_hash
    flat = {**ta_gradient(fam, "bfloat16"),
            "models": _models(fam, [{"weight": 1.0}, {"weight": 1.0}, {"weight": 2.0}])}
    assert _plan(cat, flat).plan_hash != manifest["plan_hash"]


def _plan(cat, cfg: dict[str, Any], **kw: Any):
    from mergepipe.jobs.config import load_config
    from mergepipe.planner.plan import make_plan
    request, resolved = load_config(cat, json.dumps(cfg), **kw)
    assert not resolved.to_ingest
    return make_plan(cat, request)


def test_ties_gradient_under_a_budget_is_sound_and_deterministic(fam, cat, tmp_path):
    cfg = ties_gradient(fam, "bfloat16")
    summary, _ = mp.run_ours(cat, cfg, tmp_path / "b", budget=0.4)
    assert 0 < summary["expert_bytes_read"] <= summary["budget_bytes"]
    again = _plan(cat, cfg, budget=0.4)
    assert again.plan_hash == summary["plan_hash"] and again.tensor_params
    full = _plan(cat, cfg)
    assert full.planned_expert_bytes > again.planned_expert_bytes
    # a density gradient runs each tensor whole (its threshold from the tensor, no catalog
    # trims); the densities are each tensor's: 0.7 at layer 4 (e0), 0.3 its own at layer 0
    e0 = again.request.experts[0].model
    assert full.request.whole_tensor is not None and not full.trims
    assert full.tensor_params[(e0, "model.layers.4.mlp.up_proj.weight")]["density"] == 0.7
    assert (e0, "model.layers.0.mlp.up_proj.weight") not in full.tensor_params


@pytest.mark.parametrize("edit, match", [
    # a filter list without a default and no global weight: mergekit's required-weight error
    (lambda c: c["models"][1]["parameters"].update(weight=[{"filter": "mlp", "value": 1.0}]),
     r"^experts\[1\]\.weight: Missing required parameter weight for e1\.(?!.*mlp)"),
])
def test_unresolvable_tensors_are_refused_naming_the_key(edit, match, fam, cat, tmp_path):
    cfg = ties_gradient(fam, "bfloat16")
    edit(cfg)
    with pytest.raises(InvalidRequest, match=match):
        mp.run_ours(cat, cfg, tmp_path / "x")


@pytest.mark.parametrize("params, key", [
    ({"lambda": [0.5, 1.0]}, "parameters.lambda"),
    ({"normalize": [{"filter": "mlp", "value": True}]}, "parameters.normalize"),
    ({"weight": []}, "parameters.weight"),
    ({"weight": [{"filter": "mlp"}]}, "parameters.weight[0]"),
    ({"density": [0.3, 1.5]}, "parameters.density"),
])
def test_malformed_per_tensor_settings_are_refused(params, key):
    cfg = {"merge_method": "ties", "base_model": "b", "models": [{"model": "e"}],
           "parameters": {"weight": 1.0, **params}}
    with pytest.raises(InvalidRequest) as err:
        parse_config(json.dumps(cfg))
    assert err.value.field is not None and err.value.field.startswith(key), err.value.field


@pytest.mark.slow
def test_every_dtype_gives_mergekits_bytes(fam, cat, tmp_path_factory):
    root = tmp_path_factory.mktemp("mk-all")
    theirs = mp.run_mergekit({n: CONFIGS[c](fam, d) for n, (c, d) in SLOW.items()}, root)
    for name in SLOW:
        # output names of their own: the module's catalog holds the fast tests' outputs too
        _check(name, fam, cat, theirs[name], root / "ours" / f"all-{name}")


@pytest.mark.parametrize("make", list(CONFIGS.values()))
def test_the_model_cards_mergekit_config_gives_the_same_request(make, fam):
    """The output's model card writes the settings back (each model's own, the global ones):
    parsed again, the same request."""
    from mergepipe.core.request import build_request
    from mergepipe.executor.model_card import mergekit_config

    def request(text: str):
        return build_request(**parse_config(text).request_args("base", list(mp.EXPERTS)))

    req = request(json.dumps(make(fam, "bfloat16")))
    card = mergekit_config(req)
    assert card is not None and "filter" in card
    assert request(card) == req


def test_layer_positions_and_filters_follow_mergekit():
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.w", "vision.blocks.0.attn.w",
             "vision.blocks.1.attn.w", "vision.blocks.2.attn.w", "lm_head.weight"]
    counts = layer_counts(names)
    assert counts == {"model.layers": 1, "vision.blocks": 3}
    assert [layer_t(n, counts) for n in names] == [0.0, 1.0, 0.0, 0.5, 1.0, 0.0]
    star = [{"filter": "*", "value": [0.0, 1.0]}]
    for tensor, t in (("model.layers.0.mlp.w", 0.25), ("", 0.5)):
        cond = MergeConfiguration.model_validate(
            {"merge_method": "linear", "models": [{"model": "m"}],
             "parameters": {"w": star}}).parameters["w"]
        assert resolve([star], tensor, t) == evaluate_setting(tensor, cond, t, validate=float)


def test_native_requests_take_per_tensor_settings_only_with_mergekit_semantics():
    from mergepipe.core.request import build_request
    settings = {"weight": [[[1.0, 2.0]], None]}
    experts = [{"model": "a"}, {"model": "b"}]
    with pytest.raises(InvalidRequest, match="tensor_params"):
        build_request(base="base", experts=experts, operator="task_arithmetic",
                      params={"tensor_params": settings})
    req = build_request(base="base", experts=experts, operator="task_arithmetic",
                        params={"tensor_params": settings, "semantics": "mergekit"})
    assert req.params["tensor_params"] == settings
    with pytest.raises(InvalidRequest, match="one entry per expert"):
        build_request(base="base", experts=experts[:1], operator="task_arithmetic",
                      params={"tensor_params": settings, "semantics": "mergekit"})
