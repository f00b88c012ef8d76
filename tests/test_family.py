"""The benchmark family generator: valid HF checkpoints with the promised delta structure."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mergepipe.cli.family import generate_family, read_family, shape_for_size
from mergepipe.cli.main import main
from mergepipe.storage.checkpoint import open_checkpoint
from tests.factory import load


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fam")
    generate_family(root, experts=4, size_mb=1, seed=3, lora_experts=1)
    return root


def test_layout_and_config_match_the_tensors(fam: Path) -> None:
    info = read_family(fam)
    assert [e["name"] for e in info["experts"]] == [f"expert-{i:02d}" for i in range(4)]
    cfg = json.loads((fam / "base" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    ck = open_checkpoint(fam / "expert-02").by_name()
    h, kv = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"]
    assert ck["model.embed_tokens.weight"].shape == (cfg["vocab_size"], h)
    assert ck["model.layers.0.self_attn.k_proj.weight"].shape == (kv, h)
    assert ck["model.layers.0.mlp.down_proj.weight"].shape == (h, cfg["intermediate_size"])
    assert len(ck) == 3 + 9 * cfg["num_hidden_layers"]
    total = sum(t.nbytes for t in ck.values())
    assert total == info["checkpoint_bytes"] and 0.7e6 < total < 1.3e6


def test_deltas_are_structured(fam: Path) -> None:
    info = read_family(fam)
    base = load(fam / "base")
    lora = next(e for e in info["experts"] if e["lora_like"])
    full = next(e for e in info["experts"] if not e["lora_like"])
    ex = load(fam / lora["name"])
    for n, t in base.items():
        changed = not torch.equal(ex[n], t)
        assert changed == (".q_proj." in n or ".v_proj." in n), n
    ex = load(fam / full["name"])
    deltas = {n: ex[n] - t for n, t in base.items()}
    zero = sum(int((d == 0).sum()) for d in deltas.values()) / sum(d.numel() for d in deltas.values())
    assert 0.05 < zero < 0.6  # bf16 rounding: many deltas vanish, most do not
    def layer_norm(i: int) -> float:
        return math.sqrt(sum(float(d.square().sum()) for n, d in deltas.items()
                             if n.startswith(f"model.layers.{i}.") and d.ndim == 2))
    focus = [layer_norm(i) for i in full["focus_layers"]]
    other = [layer_norm(i) for i in range(info["shape"]["layers"]) if i not in full["focus_layers"]]
    assert min(focus) > 2 * max(other)


def test_deterministic_and_sharding_independent(tmp_path: Path, fam: Path) -> None:
    rc = main(["gen-family", str(tmp_path / "f"), "--experts", "2", "--size-mb", "1",
               "--seed", "3", "--shards", "3", "--lora-experts", "1"])
    assert rc == 0
    assert len(list((tmp_path / "f" / "expert-00").glob("*.safetensors"))) == 3
    open_checkpoint(tmp_path / "f" / "expert-00")  # index consistent with the shards
    a, b = load(tmp_path / "f" / "expert-00"), load(fam / "expert-00")
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_sizes_scale() -> None:
    for mb in (1, 48, 200, 800):
        s = shape_for_size(mb)
        assert 0.85 < s.numel * 2 / (mb * 1e6) < 1.15
    with pytest.raises(ValueError):
        shape_for_size(0.01)
