"""Ingestion of PEFT LoRA adapters: key mapping, scales (rslora, patterns), B-row blocks, stats."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import xxhash
from safetensors.torch import load_file

from mergepipe.catalog.ingest import ingest_model, scan_model
from mergepipe.storage.lora import lora_delta
from tests import factory
from tests.ingest_reference import check_block_stats, check_tensor_stats, rows

SMALL = 256


def _adapter(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(str(path / "adapter_model.safetensors")).items()}


def _key(tensor: str, ab: str) -> str:
    return f"base_model.model.{tensor.removesuffix('.weight')}.lora_{ab}.weight"


def _deltas(catalog, name: str, adapter: Path) -> dict[str, torch.Tensor]:
    """The float32 delta of every covered tensor, block by block with the shared rule."""
    ad = _adapter(adapter)
    out = {}
    for t in rows(catalog, "SELECT tensor, lora_scale FROM tensors WHERE model = :m", m=name):
        a, b = ad[_key(t["tensor"], "A")], ad[_key(t["tensor"], "B")]
        blocks = rows(catalog, "SELECT row_start, row_end FROM blocks WHERE model = :m AND "
                      "tensor = :t ORDER BY block_index", m=name, t=t["tensor"])
        out[t["tensor"]] = torch.cat([lora_delta(b[r["row_start"]:r["row_end"]], a,
                                                 t["lora_scale"]) for r in blocks])
    return out


@pytest.fixture
def base(tmp_path: Path, catalog) -> Path:
    b = factory.make_base(tmp_path / "base", seed=0)
    ingest_model(catalog, b, "base", block_bytes=SMALL)
    return b


@pytest.mark.parametrize("use_rslora,dtype", [(False, "F32"), (True, "BF16")])
def test_lora_rows_scale_and_statistics(tmp_path: Path, catalog, base: Path, use_rslora: bool,
                                        dtype: str) -> None:
    ad = factory.make_lora(base, tmp_path / "lora", seed=1, r=4, alpha=8.0,
                           use_rslora=use_rslora, dtype=dtype)
    m = ingest_model(catalog, ad, "lora", base="base", kind="lora")
    scale = 8.0 / math.sqrt(4) if use_rslora else 8.0 / 4
    assert m.kind == "lora" and m.has_stats and m.lora_scale == scale
    weights = load_file(str(ad / "adapter_model.safetensors"))
    covered = sorted(k.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight"
                     for k in weights if k.endswith("lora_A.weight"))
    tensors = rows(catalog, "SELECT * FROM tensors WHERE model = 'lora' ORDER BY ordinal")
    assert sorted(t["tensor"] for t in tensors) == covered and m.n_tensors == len(covered)
    base_ordinals = {r["tensor"]: r["ordinal"] for r in
                     rows(catalog, "SELECT tensor, ordinal FROM tensors WHERE model = 'base'")}
    data = (ad / "adapter_model.safetensors").read_bytes()
    for t in tensors:
        assert t["ordinal"] == base_ordinals[t["tensor"]]
        out_f, in_f = factory.TINY_SHAPES[t["tensor"]]
        assert t["shape"] == [out_f, 4] and t["lora_a_shape"] == [4, in_f]
        assert t["dtype"] == t["lora_a_dtype"] == dtype and t["lora_scale"] == scale
        a_raw = data[t["lora_a_offset"]:t["lora_a_offset"] + t["lora_a_nbytes"]]
        want_a = weights[_key(t["tensor"], "A")]
        assert a_raw == want_a.contiguous().view(torch.uint8).numpy().tobytes()
        grid = rows(catalog, """SELECT e.*, b.nbytes AS base_nbytes FROM blocks e JOIN blocks b
                                USING (tensor, block_index, row_start, row_end)
                                WHERE e.model = 'lora' AND b.model = 'base' AND e.tensor = :t
                                ORDER BY block_index""", t=t["tensor"])
        assert len(grid) == t["n_blocks"] > 1
        row_bytes = 4 * factory.TORCH[dtype].itemsize
        for g in grid:  # a block's bytes are its lora_B rows
            assert g["byte_offset"] == t["data_offset"] + g["row_start"] * row_bytes
            assert g["nbytes"] == (g["row_end"] - g["row_start"]) * row_bytes
            raw = data[g["byte_offset"]:g["byte_offset"] + g["nbytes"]]
            assert g["content_hash"] == xxhash.xxh3_128_hexdigest(raw)
    deltas = _deltas(catalog, "lora", ad)
    # The shared block rule is scale * B @ A up to float32 rounding (checked in float64 here).
    ad_w = _adapter(ad)
    for name, d in deltas.items():
        exact = scale * (ad_w[_key(name, "B")].double() @ ad_w[_key(name, "A")].double())
        assert torch.allclose(d.double(), exact, rtol=1e-5, atol=1e-9)
    check_block_stats(catalog, "lora", deltas, rel=2e-6)
    check_tensor_stats(catalog, "lora", deltas, rel=2e-6)


def test_rank_and_alpha_patterns_give_per_tensor_scales(tmp_path: Path, catalog,
                                                        base: Path) -> None:
    ad = factory.make_lora(base, tmp_path / "lora", seed=2, r=4, alpha=8.0,
                           rank_pattern={"q_proj": 2},
                           alpha_pattern={"layers.1.self_attn.v_proj": 32.0})
    m = ingest_model(catalog, ad, "lora", base="base", kind="lora")
    assert m.lora_scale is None  # no single scale
    got = {r["tensor"]: (r["shape"][1], r["lora_scale"]) for r in
           rows(catalog, "SELECT * FROM tensors WHERE model = 'lora'")}
    assert got == {
        "model.layers.0.self_attn.q_proj.weight": (2, 4.0),
        "model.layers.1.self_attn.q_proj.weight": (2, 4.0),
        "model.layers.0.self_attn.v_proj.weight": (4, 2.0),
        "model.layers.1.self_attn.v_proj.weight": (4, 8.0),
    }
    check_tensor_stats(catalog, "lora", _deltas(catalog, "lora", ad), rel=2e-6)


def test_lora_without_stats_reads_lora_b_and_lora_a_once(tmp_path: Path, catalog,
                                                         base: Path) -> None:
    """No statistics: lora_B for the block hashes, lora_A once per tensor for its content hash
    (the executor checks both), nothing else."""
    ad = factory.make_lora(base, tmp_path / "lora", seed=3)
    scanned = scan_model(catalog, ad, "lora", base="base", kind="lora", with_stats=False)
    assert scanned.model.has_stats is False and scanned.block_stats is None
    weights = load_file(str(ad / "adapter_model.safetensors"))
    b_bytes = sum(t.numel() * 4 for k, t in weights.items() if ".lora_B." in k)
    a_bytes = sum(t.numel() * 4 for k, t in weights.items() if ".lora_A." in k)
    assert scanned.bytes_read == b_bytes + a_bytes
    assert all(h is not None for h in scanned.tensors["lora_a_hash"])


@pytest.mark.slow
def test_delta_matches_peft(tmp_path: Path, catalog, base: Path) -> None:
    """PEFT's own get_delta_weight agrees with the catalog's statistics (rslora + patterns)."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from peft.tuners.lora import Linear as LoraLinear
    from torch import nn

    ad = factory.make_lora(base, tmp_path / "lora", seed=4, r=4, alpha=6.0, use_rslora=True,
                           rank_pattern={"layers.0.self_attn.q_proj": 2},
                           alpha_pattern={"v_proj": 3.0})
    ingest_model(catalog, ad, "lora", base="base", kind="lora")
    root = nn.Module()
    for name, shape in factory.TINY_SHAPES.items():
        if len(shape) != 2:
            continue
        parent = root
        *path, leaf, _ = name.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        parent.add_module(leaf, nn.Linear(shape[1], shape[0], bias=False))
    cfg = LoraConfig(r=4, lora_alpha=6, use_rslora=True, target_modules=["q_proj", "v_proj"],
                     rank_pattern={"layers.0.self_attn.q_proj": 2},
                     alpha_pattern={"v_proj": 3.0})
    model = get_peft_model(root, cfg)
    set_peft_model_state_dict(model, load_file(str(ad / "adapter_model.safetensors")))
    stats = {r["tensor"]: r for r in rows(catalog, "SELECT * FROM tensor_stats WHERE model = "
                                          "'lora'")}
    assert len(stats) == 4
    for tensor, r in stats.items():
        module = root.get_submodule(tensor.removesuffix(".weight"))  # PEFT wraps in place
        assert isinstance(module, LoraLinear), type(module)
        d = module.get_delta_weight("default").detach()
        assert r["l2"] == pytest.approx(float(d.double().norm()), rel=1e-5)
        assert r["max_abs"] == pytest.approx(float(d.abs().max()), rel=1e-5)
