"""PEFT LoRA adapters as experts: equal to PEFT's merge_and_unload, every operator, true block cost.

Tolerance: with a float32 output the merged weights equal PEFT's float32 merge_and_unload within
float32 rounding (atol 1e-6 on weights of magnitude <= 1: both compute base + scale * B @ A in
float32, only the order of the scale multiplication and of the matmul's partial sums may differ).
With the default output dtype (the base's bf16) each weight is the float32 merge rounded once to
bf16, so it is within one bf16 ulp of PEFT's float32 merge rounded to bf16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mergepipe.catalog.db import Catalog
from mergepipe.core.request import build_request
from tests import hf_family
from tests.catalogs import new_catalog

pytest.importorskip("peft")

WEIGHTS = (1.0, 2.0, 1.0)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bf16 Llama base and three PEFT adapters (different ranks, one rslora, random lora_B)."""
    root = tmp_path_factory.mktemp("peft")
    base = hf_family.make_base(root / "base", arch="llama")
    return {
        "base": base,
        "a0": hf_family.make_lora(base, root / "a0", seed=1, r=4, alpha=8),
        "a1": hf_family.make_lora(base, root / "a1", seed=2, r=8, alpha=16,
                                  targets=("q_proj", "k_proj", "up_proj")),
        "a2": hf_family.make_lora(base, root / "a2", seed=3, r=2, alpha=4, use_rslora=True),
    }


@pytest.fixture(scope="module")
def peft_merged(adapters: dict[str, Path]) -> dict[str, dict[str, torch.Tensor]]:
    """PEFT's merge_and_unload of each adapter on the float32 base (state dicts, float32)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    out = {}
    for name in ("a0", "a1", "a2"):
        model = AutoModelForCausalLM.from_pretrained(adapters["base"], dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, adapters[name]).merge_and_unload()
        out[name] = {k: v.detach().clone() for k, v in merged.state_dict().items()}
    return out


def ingest(cat: Catalog, adapters: dict[str, Path], names: tuple[str, ...]) -> None:
    from mergepipe.catalog.ingest import ingest_model
    ingest_model(cat, adapters["base"], "base")
    for n in names:
        ingest_model(cat, adapters[n], n, base="base", kind="lora")


def test_one_adapter_linear_equals_peft_merge_and_unload(
        adapters: dict[str, Path], peft_merged: dict[str, dict[str, torch.Tensor]],
        tmp_path: Path) -> None:
    from mergepipe.jobs.merge import merge
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest(cat, adapters, ("a0",))
        merge(cat, build_request(base="base", experts="a0", operator="linear",
                                 output_dtype="F32"), tmp_path / "f32")
        merge(cat, build_request(base="base", experts="a0", operator="linear"), tmp_path / "bf16")
    ref = peft_merged["a0"]
    got = hf_family.state_dict(tmp_path / "f32")
    base = hf_family.state_dict(adapters["base"])
    assert set(got) == set(ref)
    changed = 0
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=1e-6, msg=k)
        changed += int(not torch.equal(v, base[k]))
    assert changed == 6  # q_proj, v_proj, down_proj of two layers
    bf16 = hf_family.state_dict(tmp_path / "bf16")
    for k, v in bf16.items():
        want = ref[k].to(torch.bfloat16).float()
        ulp = torch.finfo(torch.bfloat16).eps * want.abs().clamp_min(1e-30)
        assert bool(((v - want).abs() <= ulp).all()), k


def _reference(op: str, base: dict[str, torch.Tensor], deltas: list[dict[str, torch.Tensor]]
               ) -> dict[str, torch.Tensor]:
    """The operators of docs/operators.md at density 1, in torch, on PEFT's deltas."""
    out = {}
    w = torch.tensor(WEIGHTS)
    for k, b in base.items():
        d = torch.stack([dd[k] for dd in deltas])
        wd = d * w.view(-1, *([1] * b.dim()))
        if op == "linear":
            m = wd.sum(0) / w.sum()
        elif op in ("task_arithmetic", "dare_linear"):
            m = wd.sum(0) * (0.7 if op == "task_arithmetic" else 1.0)
        else:  # ties, dare_ties: sign election over weighted deltas, disjoint sum
            s = torch.where(wd.sum(0) >= 0, 1.0, -1.0)
            keep = torch.sign(wd) == s
            m = (wd * keep).sum(0)
            if op == "ties":
                div = (w.view(-1, *([1] * b.dim())) * keep).sum(0)
                m = m / torch.where(div == 0, torch.ones_like(div), div)
        out[k] = b + m
    return out


@pytest.mark.parametrize("op", ["linear", "task_arithmetic", "ties", "dare_linear", "dare_ties"])
def test_several_adapters_every_operator(
        op: str, adapters: dict[str, Path], peft_merged: dict[str, dict[str, torch.Tensor]],
        tmp_path: Path) -> None:
    from mergepipe.jobs.merge import merge
    names = ("a0", "a1", "a2")
    params: dict[str, object] = {"lambda": 0.7} if op == "task_arithmetic" else {}
    if op in ("ties", "dare_linear", "dare_ties"):
        params["density"] = 1.0
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest(cat, adapters, names)
        req = build_request(base="base", operator=op, params=params, output_dtype="F32",
                            experts=[{"model": n, "weight": w}
                                     for n, w in zip(names, WEIGHTS, strict=True)])
        summary = merge(cat, req, tmp_path / "out").to_dict()
    assert summary["expert_bytes_read"] == summary["full_read_bytes"]
    base = hf_family.state_dict(adapters["base"])
    deltas = [{k: peft_merged[n][k] - base[k] for k in base} for n in names]
    ref = _reference(op, base, deltas)
    got = hf_family.state_dict(tmp_path / "out")
    for k, v in got.items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=2e-6, msg=k)


@pytest.mark.parametrize("op", ["ties", "dare_ties"])
def test_several_adapters_sparse_under_budget(op: str, adapters: dict[str, Path],
                                              tmp_path: Path) -> None:
    from mergepipe.jobs.merge import merge
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest(cat, adapters, ("a0", "a1", "a2"))
        req = build_request(base="base", experts="a0,a1,a2", operator=op,
                            params={"density": 0.5}, budget=0.4)
        summary = merge(cat, req, tmp_path / "out").to_dict()
    assert 0 < summary["expert_bytes_read"] <= summary["budget_bytes"]
    assert all(torch.isfinite(v).all() for v in hf_family.state_dict(tmp_path / "out").values())


def test_block_cost_of_a_lora_expert_is_what_is_read(adapters: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """C(A) = the lora_B rows of the selected blocks + lora_A once per touched tensor."""
    from mergepipe.catalog.models import model_tensors
    from mergepipe.jobs.merge import merge
    from mergepipe.planner.plan import make_plan
    from mergepipe.storage.checkpoint import open_checkpoint
    adapter_bytes = sum(t.nbytes for t in open_checkpoint(adapters["a1"]).tensors)
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest(cat, adapters, ("a1",))
        lora_a = {t.name: t.lora_a.nbytes for t in model_tensors(cat, "a1") if t.lora_a}
        full = make_plan(cat, build_request(base="base", experts="a1", operator="linear"))
        assert full.full_read_bytes == full.planned_expert_bytes == adapter_bytes
        req = build_request(base="base", experts="a1", operator="linear", budget=0.5)
        plan = make_plan(cat, req)
        touched = {b.tensor for b in plan.blocks}
        assert plan.planned_expert_bytes == (sum(b.nbytes for b in plan.blocks)
                                             + sum(lora_a[t] for t in touched))
        assert plan.planned_expert_bytes <= plan.budget_bytes
        summary = merge(cat, req, tmp_path / "out").to_dict()
    assert summary["expert_bytes_read"] == plan.planned_expert_bytes
