"""Merge outputs are Hugging Face model directories: load, generate, match the torch merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.core.request import build_request
from tests import hf_family
from tests.catalogs import new_catalog

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bf16 Llama base (untied lm_head) with tokenizer + generation config, and 3 experts."""
    return hf_family.make_family(tmp_path_factory.mktemp("llama"), arch="llama")


@pytest.fixture(scope="module")
def qwen_tied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bf16 Qwen2 base with tied embeddings (no lm_head.weight on disk), and 3 experts."""
    return hf_family.make_family(tmp_path_factory.mktemp("qwen"), arch="qwen2", tied=True)


def ingest_family(cat: Catalog, fam: dict[str, Path]) -> list[str]:
    from mergepipe.catalog.ingest import ingest_model
    ingest_model(cat, fam["base"], "base")
    experts = sorted(k for k in fam if k != "base")
    for name in experts:
        ingest_model(cat, fam[name], name, base="base")
    return experts


def front_matter(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text[4:].split("\n---\n", 1)[0])


def generate(model_dir: Path) -> str:
    """Tokenize with the copied tokenizer files, generate 4 tokens, decode."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tok("w1 w2 w3", return_tensors="pt")
    assert ids["input_ids"].tolist() == [[5, 6, 7]]
    out = model.generate(**ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert out.shape[1] == 3 + 4
    return str(tok.decode(out[0]))


def logits(model_or_dir: object) -> torch.Tensor:
    from transformers import AutoModelForCausalLM
    model = (AutoModelForCausalLM.from_pretrained(model_or_dir, dtype=torch.float32)
             if isinstance(model_or_dir, Path) else model_or_dir)
    ids = torch.tensor([[1, 5, 9, 13, 40, 77]])
    with torch.no_grad():
        return model(input_ids=ids).logits  # type: ignore[operator]


def test_linear_output_loads_generates_and_equals_torch_merge(
        llama: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from mergepipe.jobs.merge import merge
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        experts = ingest_family(cat, llama)
        req = build_request(base="base", experts=[{"model": e, "weight": w} for e, w in
                                                  zip(experts, (1.0, 2.0, 1.0), strict=True)],
                            operator="linear", output_dtype="F32")
        summary = merge(cat, req, tmp_path / "out").to_dict()
    out = tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md", "manifest.json"} <= names
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    meta = front_matter(out / "README.md")
    # catalog names are not Hub ids: base_model is left out, the names are under mergepipe:
    assert "base_model" not in meta
    assert meta["mergepipe"]["base"] == "base"
    assert [e["model"] for e in meta["mergepipe"]["experts"]] == list(experts)
    assert {"merge", "mergepipe"} <= set(meta["tags"])
    assert meta["mergepipe"]["operator"] == "linear"
    assert meta["mergepipe"]["expert_bytes_read"] == summary["expert_bytes_read"]
    assert meta["mergepipe"]["merge_id"] == summary["merge_id"]

    # The merge computed by torch: B + sum_i (w_i / sum w) (E_i - B), in float32.
    base = hf_family.state_dict(llama["base"])
    ref = {k: v.clone() for k, v in base.items()}
    for e, w in zip(experts, (0.25, 0.5, 0.25), strict=True):
        for k, v in hf_family.state_dict(llama[e]).items():
            ref[k] += w * (v - base[k])
    got = hf_family.state_dict(out)
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=1e-6)
    model = AutoModelForCausalLM.from_config(hf_family.config("llama"), dtype=torch.float32)
    model.load_state_dict(ref)
    torch.testing.assert_close(logits(out), logits(model), rtol=1e-5, atol=1e-5)
    generate(out)


def test_tied_embeddings_budgeted_ties_loads_in_base_dtype(
        qwen_tied: dict[str, Path], tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from mergepipe.jobs.merge import merge
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        experts = ingest_family(cat, qwen_tied)
        req = build_request(base="base", experts=",".join(experts), operator="ties",
                            params={"density": 0.5}, budget=0.5)
        summary = merge(cat, req, tmp_path / "out").to_dict()
    out = tmp_path / "out"
    assert summary["expert_bytes_read"] <= summary["budget_bytes"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    meta = front_matter(out / "README.md")["mergepipe"]
    assert meta["budget"] == {"fraction": 0.5} and meta["parameters"]["density"] == 0.5
    generate(out)


def test_sharded_base_gives_a_sharded_output_with_index(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from mergepipe.jobs.merge import merge
    base = hf_family.make_base(tmp_path / "base", max_shard_size="40KB")
    shards = sorted(p.name for p in base.glob("*.safetensors"))
    assert len(shards) > 1
    fam = {"base": base, "e0": hf_family.make_expert(base, tmp_path / "e0", seed=1),
           "e1": hf_family.make_expert(base, tmp_path / "e1", seed=2)}
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        experts = ingest_family(cat, fam)
        merge(cat, build_request(base="base", experts=",".join(experts),
                                 operator="task_arithmetic", params={"lambda": 0.5}),
              tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    generate(out)
