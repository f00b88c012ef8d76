"""The fidelity families' model class: the sixth family (neox) builds a GPT-NeoX model that the
catalog ingests and a budgeted merge reproduces; the Llama families keep their cache keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from mergepipe_bench.fidelity.evaluate import load_state  # noqa: E402
from mergepipe_bench.fidelity.family import base_key  # noqa: E402
from mergepipe_bench.fidelity.model import ModelSize, load_model, new_model, save_bf16  # noqa: E402
from mergepipe_bench.fidelity.ranking_study import FAMILIES  # noqa: E402

from mergepipe.catalog.db import Catalog  # noqa: E402
from mergepipe.catalog.ingest import ingest_model  # noqa: E402
from mergepipe.core.request import build_request  # noqa: E402
from mergepipe.jobs.merge import execute_plan  # noqa: E402
from mergepipe.planner.plan import make_plan  # noqa: E402

TINY_NEOX = ModelSize(hidden=32, intermediate=64, layers=2, heads=2, arch="gpt_neox")


def test_the_neox_family_builds_a_gpt_neox_model() -> None:
    size = FAMILIES["neox"]().size
    model = new_model(size, 0)
    assert type(model).__name__ == "GPTNeoXForCausalLM"
    names = set(model.state_dict())
    assert "gpt_neox.layers.0.attention.query_key_value.bias" in names  # fused q/k/v, biases
    assert "gpt_neox.layers.5.input_layernorm.bias" in names  # LayerNorm with biases, 6 layers
    assert model.config.hidden_size == 192 and model.config.use_parallel_residual
    assert FAMILIES["neox"]().experts_per_task * len(FAMILIES["neox"]().tasks) >= 12


def test_an_unknown_arch_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'mamba'"):
        ModelSize(arch="mamba").config()


def test_the_llama_families_keep_their_cache_keys() -> None:
    # the folders the earlier passes trained (family-<key>, base-<key>) must still be found
    keys = {k: (f().key(), base_key(f())) for k, f in FAMILIES.items()}
    assert keys["toy"] == ("da734b0d29bd", "3905930cde42")
    assert keys["realistic"] == ("91ceb9df0094", "3905930cde42")
    assert keys["small-s1"] == ("b1c01fcc3aad", "7472f70ae7de")
    assert "arch" not in ModelSize().to_dict()
    assert keys["neox"][0] != keys["toy"][0]
    assert base_key(FAMILIES["neox"]()) not in {v[1] for k, v in keys.items() if k != "neox"}


def test_a_gpt_neox_family_merges_through_the_catalog(tmp_path: Path) -> None:
    """A tiny untrained GPT-NeoX base and two experts (perturbed copies): the full linear merge
    equals the mean of the experts and loads as a GPT-NeoX model."""
    base = new_model(TINY_NEOX, 0)
    save_bf16(base, tmp_path / "base", "f32")
    experts = []
    for i in (1, 2):
        m = load_model(tmp_path / "base")
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=g))
        save_bf16(m, tmp_path / f"e{i}", "f32")
        experts.append(load_state(tmp_path / f"e{i}"))
    with Catalog(tmp_path / "c.duckdb") as cat:
        ingest_model(cat, str(tmp_path / "base"), "base", block_bytes=4 << 10)
        for i in (1, 2):
            ingest_model(cat, str(tmp_path / f"e{i}"), f"e{i}", base="base", block_bytes=4 << 10)
        def request(budget: float) -> Any:
            return build_request(base="base", experts=[{"model": "e1"}, {"model": "e2"}],
                                 operator="linear", params={}, budget=budget, seed=0,
                                 output_dtype="F32")
        execute_plan(cat, make_plan(cat, request(1.0)), tmp_path / "full", threads=1,
                     overwrite=True)
        half = make_plan(cat, request(0.5))
        summary = execute_plan(cat, half, tmp_path / "half", threads=1, overwrite=True)
        assert summary.expert_bytes_read <= half.budget_bytes
    merged = load_state(tmp_path / "full")
    assert set(merged) == set(experts[0])
    for k, v in merged.items():
        torch.testing.assert_close(v, (experts[0][k] + experts[1][k]) / 2, rtol=0, atol=1e-6)
    assert type(load_model(tmp_path / "half")).__name__ == "GPTNeoXForCausalLM"
