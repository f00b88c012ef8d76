"""Ingestion refuses bad input with a clear error naming file / tensor, and registers nothing."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mergepipe.catalog import ingest as ingest_module
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.errors import (
    Conflict,
    InvalidCheckpoint,
    InvalidRequest,
    MergePipeError,
    NotFound,
    SourceChanged,
)
from tests import factory
from tests.ingest_reference import nothing_registered, registered, rows

SMALL = 256


@pytest.fixture
def base(tmp_path: Path, catalog) -> Path:
    b = factory.make_base(tmp_path / "base", seed=0)
    ingest_model(catalog, b, "base", block_bytes=SMALL)
    return b


def _refused(catalog, exc: type[MergePipeError], *needles: str, name: str = "x", **kw):
    """Ingest with `kw`, expect `exc` whose message holds every needle; nothing registered."""
    path = kw.pop("path")
    with pytest.raises(exc) as info:
        ingest_model(catalog, path, name, **kw)
    for n in needles:
        assert n in info.value.message, (n, info.value.message)
    assert nothing_registered(catalog, name), registered(catalog, name)
    return info.value


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a checkpoint directory, passing its tensors through edit(dict) -> dict."""
    tensors = {k: v.clone() for k, v in load_file(str(src / "model.safetensors")).items()}
    dst.mkdir(parents=True)
    save_file(edit(tensors), str(dst / "model.safetensors"))
    return dst


def test_a_name_in_use_gets_a_new_version_and_keeps_the_first(tmp_path: Path, catalog,
                                                               base) -> None:
    before = registered(catalog, "base")
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    row = ingest_model(catalog, e, "base")  # other bytes under the same name
    assert (row.name, row.family, row.version) == ("base~2", "base", 2)
    assert registered(catalog, "base") == before


def test_name_taken_between_scan_and_write(tmp_path: Path, catalog, base) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    first = ingest_module.scan_model(catalog, e, "e", base="base")
    second = ingest_module.scan_model(catalog, e, "e", base="base")
    with catalog.transaction() as conn:
        ingest_module.write_model(conn, first)
    with pytest.raises(Conflict), catalog.transaction() as conn:
        ingest_module.write_model(conn, second)
    assert registered(catalog, "e")["blocks"] == registered(catalog, "base")["blocks"]


def test_unknown_base_is_not_found(tmp_path: Path, catalog, base) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    err = _refused(catalog, NotFound, "'nope'", path=e, base="nope")
    assert err.status == 404 and err.field == "base"


def test_base_must_be_a_base(tmp_path: Path, catalog, base) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    ingest_model(catalog, e, "e", base="base", with_stats=False)
    _refused(catalog, InvalidRequest, "'e' is an expert of 'base'", path=e, base="e")


@pytest.mark.parametrize("kw,needle", [
    ({"kind": "nope"}, "kind 'nope'"),
    ({"kind": "delta"}, "needs --base"),
    ({"kind": "lora"}, "needs --base"),
    ({"block_bytes": 0}, "block size 0"),
    ({"block_bytes": "1MiB"}, "block size '1MiB'"),
])
def test_bad_arguments(tmp_path: Path, catalog, kw: dict, needle: str) -> None:
    b = factory.make_base(tmp_path / "b", seed=1)
    _refused(catalog, InvalidRequest, needle, path=b, **kw)


@pytest.mark.parametrize("name", ["", "a b", "x/y", "../up", "-dash", "e:0.5", "a,b", "x" * 129])
def test_bad_names(tmp_path: Path, catalog, name: str) -> None:
    b = factory.make_base(tmp_path / "b", seed=1)
    _refused(catalog, InvalidRequest, "model name", path=b, name=name)


def test_expert_block_bytes_must_be_the_bases(tmp_path: Path, catalog, base) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    _refused(catalog, InvalidRequest, "256 bytes, not 512", path=e, base="base", block_bytes=512)


def test_missing_tensor(tmp_path: Path, catalog, base) -> None:
    e = _rewrite(base, tmp_path / "e", lambda t: {k: v for k, v in t.items()
                                                  if k != "model.norm.weight"})
    _refused(catalog, InvalidCheckpoint, "missing", "'model.norm.weight'", str(e), path=e,
             base="base")


def test_extra_tensor(tmp_path: Path, catalog, base) -> None:
    e = _rewrite(base, tmp_path / "e", lambda t: {**t, "extra.bias": torch.zeros(3)})
    _refused(catalog, InvalidCheckpoint, "not in base", "'extra.bias'", path=e, base="base")


def test_shape_mismatch(tmp_path: Path, catalog, base) -> None:
    name = "model.layers.0.mlp.up_proj.weight"
    e = _rewrite(base, tmp_path / "e", lambda t: {**t, name: t[name][:40].contiguous()})
    _refused(catalog, InvalidCheckpoint, repr(name), "[40, 32]", "[48, 32]",
             str(e / "model.safetensors"), path=e, base="base")


def test_unreadable_dtype(tmp_path: Path, catalog, base) -> None:
    name = "model.norm.weight"
    e = _rewrite(base, tmp_path / "e", lambda t: {**t, name: t[name].double()})
    _refused(catalog, InvalidCheckpoint, repr(name), "'F64' unsupported", path=e, base="base")


def test_truncated_file(tmp_path: Path, catalog, base) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    f = e / "model.safetensors"
    os.truncate(f, f.stat().st_size - 100)
    _refused(catalog, InvalidCheckpoint, str(f), "truncated", path=e, base="base")


def test_corrupt_header(tmp_path: Path, catalog) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    js = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'  # unterminated
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(js)) + js + b"\0" * 8)
    _refused(catalog, InvalidCheckpoint, str(d / "model.safetensors"), "not valid JSON", path=d)


def test_no_such_path(tmp_path: Path, catalog) -> None:
    _refused(catalog, InvalidCheckpoint, "no such file", path=tmp_path / "nowhere")


def _poison(t: dict, name: str, row: int, value: float) -> dict:
    w = t[name].clone()
    w[row, 3] = value
    return {**t, name: w}


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_expert_names_tensor_and_block(tmp_path: Path, catalog, base,
                                                 value: float) -> None:
    name = "model.layers.1.mlp.gate_proj.weight"  # (48, 32) bf16: 4 rows per 256-byte block
    e = _rewrite(base, tmp_path / "e", lambda t: _poison(t, name, 41, value))
    _refused(catalog, InvalidCheckpoint, repr(name), "block 10 (rows 40..44)", "NaN or Inf",
             path=e, base="base")


def test_nonfinite_base_is_refused(tmp_path: Path, catalog) -> None:
    b = factory.make_base(tmp_path / "b", seed=3)
    bad = _rewrite(b, tmp_path / "bad", lambda t: _poison(t, "lm_head.weight", 0, float("inf")))
    _refused(catalog, InvalidCheckpoint, "'lm_head.weight'", "block 0", path=bad, name="b")


def test_nonfinite_without_stats_is_refused(tmp_path: Path, catalog, base) -> None:
    e = _rewrite(base, tmp_path / "e", lambda t: _poison(t, "lm_head.weight", 5, float("nan")))
    _refused(catalog, InvalidCheckpoint, "'lm_head.weight'", path=e, base="base",
             with_stats=False)


def test_delta_overflow_is_refused(tmp_path: Path, catalog) -> None:
    b = factory.save_checkpoint(tmp_path / "b", {"w": torch.full((4, 4), -3e38)}, "F32")
    e = factory.save_checkpoint(tmp_path / "e", {"w": torch.full((4, 4), 3e38)}, "F32")
    ingest_model(catalog, b, "b")
    _refused(catalog, InvalidCheckpoint, "float32 overflow", path=e, base="b")


def test_base_changed_since_its_ingestion(tmp_path: Path, catalog, base) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    f = base / "model.safetensors"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    ingest_model(catalog, e, "touched", base="base")  # same bytes: re-verified by hash
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x5A
    f.write_bytes(bytes(data))
    _refused(catalog, SourceChanged, "'base'", str(f), "content hash", path=e, base="base")
    ingest_model(catalog, e, "x", base="base", with_stats=False)  # the base is not read


def test_write_failure_leaves_nothing(tmp_path: Path, catalog, base, monkeypatch) -> None:
    e = factory.make_expert(base, tmp_path / "e", seed=1)
    real = ingest_module.load_sql

    def failing(name: str):
        if name == "tensor_stats_insert":  # the last table written
            raise RuntimeError("disk full")
        return real(name)

    monkeypatch.setattr(ingest_module, "load_sql", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        ingest_model(catalog, e, "e", base="base")
    assert nothing_registered(catalog, "e")


def test_kind_must_match_the_directory(tmp_path: Path, catalog, base) -> None:
    ad = factory.make_lora(base, tmp_path / "lora", seed=1)
    _refused(catalog, InvalidCheckpoint, "kind lora", path=ad, base="base")
    _refused(catalog, InvalidCheckpoint, "not a PEFT LoRA adapter", path=base, base="base",
             kind="lora")


# -- LoRA adapters -------------------------------------------------------------------------------

@pytest.mark.parametrize("config,needle", [
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"use_dora": True}, "DoRA"),
    ({"bias": "all"}, "bias='all'"),
    ({"lora_bias": True}, "lora_bias"),
    ({"peft_type": "IA3"}, "peft_type 'IA3'"),
    ({"lora_alpha": "eight"}, "lora_alpha 'eight'"),
    ({"r": 8}, "r=8"),
])
def test_lora_config_refused(tmp_path: Path, catalog, base, config: dict, needle: str) -> None:
    ad = factory.make_lora(base, tmp_path / "lora", seed=1, config=config)
    _refused(catalog, InvalidCheckpoint, needle, path=ad, base="base", kind="lora")


def _edit_adapter(ad: Path, edit) -> Path:
    f = ad / "adapter_model.safetensors"
    tensors = {k: v.clone() for k, v in load_file(str(f)).items()}
    save_file(edit(tensors), str(f))
    return ad


Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("edit,needles", [
    (lambda t: {**t, "base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 64)},
     ["embedding LoRA", "lora_embedding_A"]),
    (lambda t: {**t, f"{Q}.lora_magnitude_vector": torch.ones(32)}, ["DoRA"]),
    (lambda t: {**t, f"{Q}.lora_B.bias": torch.ones(32)}, ["lora_B bias"]),
    (lambda t: {**t, "base_model.model.lm_head.modules_to_save.default.weight":
                torch.zeros(64, 32)}, ["modules_to_save"]),
    (lambda t: {k: v for k, v in t.items() if k != f"{Q}.lora_B.weight"},
     ["'model.layers.0.self_attn.q_proj'", "no lora_B"]),
    (lambda t: {**t, f"{Q}.lora_A.weight": torch.zeros(4, 31)},
     ["does not fit", "'model.layers.0.self_attn.q_proj.weight'", "[32, 32]"]),
    (lambda t: {**t, "base_model.model.model.layers.0.self_attn.w_proj.lora_A.weight":
                torch.zeros(4, 32),
                "base_model.model.model.layers.0.self_attn.w_proj.lora_B.weight":
                torch.zeros(32, 4)}, ["base has no tensor", "w_proj"]),
    (lambda t: {**t, "base_model.model.model.norm.lora_A.weight": torch.zeros(4, 32),
                "base_model.model.model.norm.lora_B.weight": torch.zeros(32, 4)},
     ["'model.norm.weight'", "2-D"]),
    (lambda t: {**t, f"{Q}.lora_A.weight": torch.full((4, 32), float("nan"))}, ["lora_A"]),
    (lambda t: {**t, f"{Q}.lora_B.weight": torch.full((32, 4), float("inf"))}, ["lora_B"]),
])
def test_lora_tensors_refused(tmp_path: Path, catalog, base, edit, needles: list[str]) -> None:
    ad = _edit_adapter(factory.make_lora(base, tmp_path / "lora", seed=1), edit)
    _refused(catalog, InvalidCheckpoint, *needles, path=ad, base="base", kind="lora")


def test_adapter_without_weights(tmp_path: Path, catalog, base) -> None:
    ad = factory.make_lora(base, tmp_path / "lora", seed=1)
    (ad / "adapter_model.safetensors").unlink()
    _refused(catalog, InvalidCheckpoint, "adapter_model.safetensors", path=ad, base="base",
             kind="lora")


def test_adapter_config_not_json(tmp_path: Path, catalog, base) -> None:
    ad = factory.make_lora(base, tmp_path / "lora", seed=1)
    (ad / "adapter_config.json").write_text("{not json")
    _refused(catalog, InvalidCheckpoint, "adapter_config.json", path=ad, base="base", kind="lora")
    assert rows(catalog, "SELECT count(*) AS n FROM models")[0]["n"] == 1
