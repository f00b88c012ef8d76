"""mergekit 0.1.5 parity on other architectures than Llama (tests/arch_family.py: Qwen2 with q/k/v
biases, GPT-NeoX with fused query_key_value, LayerNorm biases and mergekit's required buffers,
Phi-3 with fused qkv_proj / gate_up_proj, Gemma 2 with four norms per layer and tied
embeddings). Each config runs through mergekit-yaml (a subprocess) and through MergePipe at full
budget; the outputs must have the same tensor names, dtypes, shapes and bytes.

Expected as on the Llama family (tests/test_mergekit_parity.py): linear, task_arithmetic and the
geometric methods bit-identical; TIES and breadcrumbs bit-identical off the entries tied at a
cut (mergekit's sort keeps an arbitrary subset there); DARE and della within mergekit's own
seed-to-seed spread. What mergekit cannot merge on an architecture is left out and said why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mergepipe.api import Catalog as Api
from mergepipe.catalog.db import Catalog
from mergepipe.core.settings import Settings
from tests import arch_family as af
from tests import catalogs
from tests import geometric_parity as gp
from tests import mergekit_parity as mp

pytest.importorskip("mergekit", reason="mergekit (test extra) is the conformance reference")

from tests.test_mergekit_parity_sparse import band_untied, run_seeded  # noqa: E402

COMPUTE = {"bfloat16": torch.bfloat16, "float16": torch.float16}
GAMMA = 0.05
# Left out, as mergekit 0.1.5 fails on them: della on GPT-NeoX (its 0-d masked_bias: della ranks
# along a second axis; MergePipe refuses it by name), a float16 GPT-NeoX (masked_bias -1e9 is
# -inf in float16: mergekit writes it, MergePipe refuses the non-finite output).
# Stacked slices on Qwen2 and Gemma 2: mergekit fails writing the config (its per-layer
# `layer_types` keep the source's length; test_passthrough_keeps_layer_types_one_per_layer).
SKIP = {("gpt_neox", "della"), ("gpt_neox", "float16"), ("qwen2", "slices"),
        ("gemma2", "slices")}


def cases(fam: dict[str, Path], arch: str) -> dict[str, tuple[dict[str, Any], int, str]]:
    """name -> (config, mergekit seed, how it is compared) of the sweep."""
    out: dict[str, tuple[dict[str, Any], int, str]] = {}
    for d in COMPUTE:
        if (arch, d) in SKIP:
            continue
        out[f"linear-{d}"] = (mp.config("linear", fam, d, base_entry={"parameters": {
            "weight": 0.0}}), 1, "exact")
        out[f"task_arithmetic-{d}"] = (mp.config("task_arithmetic", fam, d,
                                                 params={"lambda": 0.6}), 1, "exact")
        out[f"ties-{d}"] = (mp.config("ties", fam, d), 1, "ties")
        out[f"breadcrumbs-{d}"] = (mp.config("breadcrumbs", fam, d, params={"gamma": GAMMA}),
                                   1, "band")
        for m, p in (("slerp", {"t": 0.3}), ("nuslerp", {}), ("model_stock", {})):
            out[f"{m}-{d}"] = (gp.config(m, fam, d, p), 1, "exact")
    if (arch, "slices") not in SKIP:  # 3 layers: e0's two, then e1's second
        out["slices-bfloat16"] = ({"merge_method": "passthrough", "dtype": "bfloat16", "slices": [
            {"sources": [{"model": str(fam["e0"]), "layer_range": [0, 2]}]},
            {"sources": [{"model": str(fam["e1"]), "layer_range": [1, 2]}]}]}, 1, "slices")
    drawn: dict[str, dict[str, Any] | None] = {"dare_ties": None, "della": {"epsilon": 0.1}}
    for m, params in drawn.items():
        if (arch, m) not in SKIP:
            for s in (1, 2):
                out[f"{m}-bfloat16@{s}"] = (mp.config(m, fam, "bfloat16", params=params), s,
                                           "random")
    return out


def _rel(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    """rel L2 over the trained tensors (GPT-NeoX's buffers, untouched, would swamp it)."""
    keep = [k for k in theirs if af.buffer_value(k) is None]
    return mp.differences({k: ours[k] for k in keep}, {k: theirs[k] for k in keep})[2]


def check(arch: str, fam, cat: Catalog, root: Path, names: list[str] | None = None
          ) -> dict[str, str]:
    """Run `names` (default: the whole sweep) through both tools; assert; the outcome table."""
    todo = {n: c for n, c in cases(fam, arch).items()
            if names is None or n.split("@")[0] in names}
    (root / "mk").mkdir(parents=True, exist_ok=True)
    theirs = run_seeded({n: (cfg, seed) for n, (cfg, seed, _) in todo.items()}, root / "mk")
    table = {}
    for name, (cfg, _, kind) in todo.items():
        if name.endswith("@2"):
            continue
        case = name.removesuffix("@1")
        if kind == "slices":
            Api.over(cat, Settings.from_env({})).merge(cfg, out=root / "ours" / case,
                                                      progress=False)
            ours = mp.load_raw(root / "ours" / case)
        else:
            summary, ours = mp.run_ours(cat, cfg, root / "ours" / case)
            assert summary["expert_bytes_read"] == summary["full_read_bytes"], case
        ref = theirs[name]
        assert set(ours) == set(ref), (case, set(ours) ^ set(ref))
        for k, t in ref.items():
            assert (ours[k].dtype, ours[k].shape) == (t.dtype, t.shape), (case, k)
        dtype = COMPUTE.get(case.rsplit("-", 1)[1], torch.bfloat16)
        if kind == "random":
            ours_vs, spread = _rel(ours, ref), _rel(theirs[f"{case}@2"], ref)
            assert 0 < ours_vs < 1.5 * spread, (case, ours_vs, spread)
            table[case] = f"rel L2 {ours_vs:.2e} (mergekit seed 1 vs 2: {spread:.2e})"
            continue
        keep = (mp.untied(fam, dtype) if kind == "ties" else
                band_untied(fam, dtype, GAMMA) if kind == "band" else None)
        differ, compared, _ = mp.differences(ours, ref, keep)
        assert differ == 0, f"{arch} {case}: {differ} of {compared} entries differ"
        table[case] = f"0 of {compared}"
    return table


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("arch")
    return {a: af.make_family(root / a, a) for a in af.ARCHS}


def test_ties_on_every_architecture_gives_mergekits_bytes(families, cat, tmp_path):
    """One TIES config in bfloat16 per architecture, all in one mergekit subprocess."""
    cfgs = {a: (mp.config("ties", fam, "bfloat16"), 1) for a, fam in families.items()}
    theirs = run_seeded(cfgs, tmp_path)
    for arch, fam in families.items():
        _, ours = mp.run_ours(cat, cfgs[arch][0], tmp_path / "ours" / arch)
        assert set(ours) == set(theirs[arch]), arch
        differ, compared, _ = mp.differences(ours, theirs[arch],
                                             mp.untied(fam, torch.bfloat16))
        assert differ == 0 and compared > 0.95 * sum(t.numel() for t in ours.values()), arch


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(af.ARCHS))
def test_every_method_on_the_architecture_gives_mergekits_bytes(arch, families, tmp_path):
    cat = Catalog(catalogs.new_catalog(tmp_path, "cat"))
    try:
        table = check(arch, families[arch], cat, tmp_path)
    finally:
        cat.close()
    print(f"CONFORMANCE {arch}: {json.dumps(table)}")


def test_passthrough_keeps_layer_types_one_per_layer(tmp_path):
    """A config with per-layer `layer_types` (Qwen2, Gemma 2 and 3 as transformers 5 saves
    them): the stacked output's list follows its layers, from each slice's source, so
    transformers loads the config (mergekit 0.1.5 fails writing it: `num_hidden_layers` (3)
    must be equal to the number of `layer_types` (2))."""
    fam = af.make_family(tmp_path / "fam", "qwen2")
    for name, kinds in (("e0", ["full_attention", "sliding_attention"]),
                        ("e1", ["sliding_attention", "full_attention"])):
        p = fam[name] / "config.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "layer_types": kinds}))
    cfg = {"merge_method": "passthrough", "dtype": "bfloat16", "slices": [
        {"sources": [{"model": str(fam["e0"]), "layer_range": [0, 2]}]},
        {"sources": [{"model": str(fam["e1"]), "layer_range": [1, 2]}]}]}
    from transformers import AutoConfig
    cat = Catalog(catalogs.new_catalog(tmp_path, "cat"))
    try:
        api = Api.over(cat, Settings.from_env({}))
        api.merge(cfg, out=tmp_path / "out", progress=False)
        doc = json.loads((tmp_path / "out" / "config.json").read_text())
        assert doc["num_hidden_layers"] == 3
        assert doc["layer_types"] == ["full_attention", "sliding_attention", "full_attention"]
        assert AutoConfig.from_pretrained(str(tmp_path / "out")).num_hidden_layers == 3
        # a source without the list: the output has none (transformers derives it)
        p = fam["e1"] / "config.json"
        p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items()
                                 if k != "layer_types"}))
        api.merge(cfg, out=tmp_path / "out2", progress=False)
    finally:
        cat.close()
    assert "layer_types" not in json.loads((tmp_path / "out2" / "config.json").read_text())
    assert len(AutoConfig.from_pretrained(str(tmp_path / "out2")).layer_types) == 3


def test_a_merge_past_float16s_range_is_refused_before_anything_is_published(families, cat,
                                                                              tmp_path):
    """GPT-NeoX's masked_bias (-1e9, as in Pythia's files) is -inf in float16: mergekit writes
    it so; MergePipe refuses the merge, naming the tensor and the dtype, and publishes nothing
    (before, the output was published, found non-finite when registered as a model, and
    removed, with an error that blamed the output file's weights)."""
    from mergepipe.core.errors import InvalidRequest
    fam = families["gpt_neox"]
    keep_out = {"parameters": {"weight": 0.0}}  # the base out of the average
    with pytest.raises(InvalidRequest) as e:
        mp.run_ours(cat, mp.config("linear", fam, "float16", base_entry=keep_out),
                    tmp_path / "out")
    assert "'gpt_neox.layers.0.attention.masked_bias'" in e.value.message
    assert "float16" in e.value.message and "nothing was published" in e.value.message
    assert not (tmp_path / "out").exists()
    _, ours = mp.run_ours(cat, mp.config("linear", fam, "bfloat16", base_entry=keep_out),
                          tmp_path / "bf16")  # bfloat16 holds it
    assert float(ours["gpt_neox.layers.0.attention.masked_bias"]) < -9e8


def test_a_passthrough_past_float16s_range_is_refused_before_anything_is_published(tmp_path):
    """The same for a passthrough copy written in float16 (before: published, then removed)."""
    from mergepipe.core.errors import InvalidRequest
    fam = af.make_family(tmp_path / "fam", "gpt_neox")
    cfg = {"merge_method": "passthrough", "models": [{"model": str(fam["e0"])}],
           "out_dtype": "float16"}
    cat = Catalog(catalogs.new_catalog(tmp_path, "cat"))
    try:
        with pytest.raises(InvalidRequest, match="masked_bias'.* float16 .*nothing was published"):
            Api.over(cat, Settings.from_env({})).merge(cfg, out=tmp_path / "out", progress=False)
    finally:
        cat.close()
    assert not (tmp_path / "out").exists()


def test_what_mergekit_merges_on_gpt_neox_and_mergepipe_refuses_is_named(families, cat,
                                                                         tmp_path):
    """Refused before anything is written, naming the tensor: della on GPT-NeoX's 0-d
    masked_bias (mergekit 0.1.5 fails on it too: della ranks along a second axis), and
    Pythia's BOOL causal masks (mergekit merges them as numbers; MergePipe reads F32, F16 and
    BF16 only)."""
    from safetensors.torch import save_file

    from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest
    fam = families["gpt_neox"]
    with pytest.raises(InvalidRequest, match="della .*'gpt_neox.layers.0.attention.masked_bias'"
                                             ".* shape \\[\\]"):
        mp.run_ours(cat, mp.config("della", fam, "bfloat16", params={"epsilon": 0.1}),
                    tmp_path / "della")
    assert not (tmp_path / "della").exists()
    mask = "gpt_neox.layers.1.attention.bias"
    pythia = {k: v.to(torch.bool if k == mask else torch.bfloat16)
              for k, v in af.weights(af.spec("gpt_neox")[0], 0).items()}
    (tmp_path / "pythia").mkdir()
    save_file(pythia, str(tmp_path / "pythia" / "model.safetensors"))
    cfg = mp.config("task_arithmetic", {**fam, "base": tmp_path / "pythia"}, "bfloat16")
    with pytest.raises(InvalidCheckpoint, match=f"pythia/model.safetensors: tensor '{mask}': "
                                                "dtype 'BOOL' unsupported"):
        mp.run_ours(cat, cfg, tmp_path / "ta")
    assert not (tmp_path / "ta").exists()
