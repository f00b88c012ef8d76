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
from mergepipe_bench.fidelity.random_plan import _first_fit, candidates  # noqa: E402
from mergepipe_bench.fidelity.ranking_study import FAMILIES  # noqa: E402
from mergepipe_bench.fidelity.tensor_probe import coverage, omit_plan  # noqa: E402

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
    control = new_model(FAMILIES["neox-llama"]().size, 0)  # the same shape in the Llama class
    assert type(control).__name__ == "LlamaForCausalLM"
    assert (control.config.hidden_size, control.config.num_hidden_layers) == (192, 6)


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
    # neox-brisk trains other experts on neox's base, on purpose (the regime rule's held-out)
    assert keys["neox-brisk"][1] == keys["neox"][1] != keys["neox-brisk"][0]
    assert base_key(FAMILIES["neox"]()) not in {v[1] for k, v in keys.items()
                                                if k not in ("neox", "neox-brisk")}


@pytest.fixture(scope="module")
def neox_family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A tiny untrained GPT-NeoX base and two experts (seeded perturbations of 1e-3), float32,
    ingested into tmp/c.duckdb; returns the folder and the experts' tensors."""
    root = tmp_path_factory.mktemp("neox")
    save_bf16(new_model(TINY_NEOX, 0), root / "base", "f32")
    experts = []
    for i in (1, 2):
        m = load_model(root / "base")
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1e-3 * torch.randn(p.shape, generator=g))
        save_bf16(m, root / f"e{i}", "f32")
        experts.append(load_state(root / f"e{i}"))
    with Catalog(root / "c.duckdb") as cat:
        ingest_model(cat, str(root / "base"), "base", block_bytes=4 << 10)
        for i in (1, 2):
            ingest_model(cat, str(root / f"e{i}"), f"e{i}", base="base", block_bytes=4 << 10)
    return root, experts


def _request(budget: float) -> Any:
    return build_request(base="base", experts=[{"model": "e1"}, {"model": "e2"}],
                         operator="linear", params={}, budget=budget, seed=0, output_dtype="F32")


def test_a_gpt_neox_family_merges_through_the_catalog(
        neox_family: tuple[Path, list[dict]], tmp_path: Path) -> None:
    """The full linear merge equals the mean of the experts; a budgeted one stays within its
    budget and loads as a GPT-NeoX model."""
    root, experts = neox_family
    with Catalog(root / "c.duckdb") as cat:
        execute_plan(cat, make_plan(cat, _request(1.0)), tmp_path / "full", threads=1,
                     overwrite=True)
        half = make_plan(cat, _request(0.5))
        summary = execute_plan(cat, half, tmp_path / "half", threads=1, overwrite=True)
        assert summary.expert_bytes_read <= half.budget_bytes
    merged = load_state(tmp_path / "full")
    assert set(merged) == set(experts[0])
    for k, v in merged.items():
        torch.testing.assert_close(v, (experts[0][k] + experts[1][k]) / 2, rtol=0, atol=1e-6)
    assert type(load_model(tmp_path / "half")).__name__ == "GPTNeoXForCausalLM"


def test_the_probe_counts_what_a_plan_reads_per_tensor(neox_family: tuple[Path, list[dict]]
                                                       ) -> None:
    root, _ = neox_family
    with Catalog(root / "c.duckdb") as cat:
        full = make_plan(cat, _request(1.0))
        cands = candidates(cat, full)
    assert set(coverage(full, cands).values()) == {(1.0, 1.0)}
    plan = omit_plan(full, cands, "embed_in")
    gone = [c for c in cands if "embed_in" in c.tensor]
    assert {c.model for c in gone} == {"e1", "e2"}
    assert plan.planned_expert_bytes == full.planned_expert_bytes - sum(c.nbytes for c in gone)
    cover = coverage(plan, cands)
    assert cover.pop("gpt_neox.embed_in.weight") == (0.0, 0.0)
    assert set(cover.values()) == {(1.0, 1.0)}
    # one tensor read for e2 and one block of e1: the byte share counts the blocks read, the
    # energy share their a_u^2
    t = "gpt_neox.layers.0.attention.query_key_value.weight"
    mine = [c for c in cands if c.tensor == t]
    e1 = [c for c in mine if c.model == "e1"]
    assert len(e1) > 1
    read = [c for c in mine if c.model == "e2"] + e1[:1]
    keep = [c for c in cands if c.tensor != t] + read
    part = coverage(_first_fit(full, cands, keep, {}), cands)[t]
    assert part == pytest.approx((sum(c.nbytes for c in read) / sum(c.nbytes for c in mine),
                                  sum(c.utility ** 2 for c in read)
                                  / sum(c.utility ** 2 for c in mine)))
    assert part[0] < 1
