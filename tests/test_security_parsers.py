"""Bounded parsers (issue 11): PEFT patterns through RE2 (no ReDoS) with PEFT's matching rule,
YAML without aliases / dates / huge integers, error messages of bounded size, safetensors files
whose tensors must tile the data section exactly, caps on tensors, headers, index files and the
block size."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ingest_model
from mergepipe.core.checkpoint_limits import CheckpointLimits
from mergepipe.core.errors import MAX_MESSAGE_CHARS, InvalidCheckpoint, InvalidRequest
from mergepipe.core.mergekit_config import parse_config
from mergepipe.storage import checkpoint, safetensors_format
from mergepipe.storage.checkpoint import open_checkpoint
from mergepipe.storage.lora import adapter_scale, configured_rank
from mergepipe.storage.safetensors_format import read_header
from tests import factory
from tests.catalogs import new_catalog

# -- ReDoS -------------------------------------------------------------------------------------


def _peft_rule(pattern: dict[str, int], module: str) -> str | None:
    """PEFT's get_pattern_key with `re` (test side only, on trusted patterns)."""
    return next((k for k in pattern if re.match(rf"(.*\.)?({k})$", module)), None)


@pytest.mark.parametrize("key", ["(a+)+$", "(a|aa)+$", "(a*)*b", "(.*a){25}"])
def test_a_catastrophic_pattern_runs_in_linear_time(key: str) -> None:
    """On 0.1 `re` took exponential time in the module name (and held the GIL)."""
    config = {"r": 4, "lora_alpha": 8, "rank_pattern": {key: 2}}
    module = "a" * 20_000 + "!"
    t0 = time.perf_counter()
    assert configured_rank(config, module) == 4  # no match: the default rank
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("key", [r"(a)\1", r"(?=q)q_proj", r"(?<!x)v_proj"])
def test_patterns_re2_cannot_run_are_refused_by_name(key: str) -> None:
    config = {"r": 4, "lora_alpha": 8, "alpha_pattern": {key: 2.0}}
    with pytest.raises(InvalidCheckpoint, match="alpha_pattern") as e:
        adapter_scale(config, "model.layers.0.self_attn.q_proj", 4)
    assert e.value.field == "alpha_pattern"


def test_pattern_matching_keeps_peft_semantics() -> None:
    pattern = {"q_proj": 2, r"layers\.1\.self_attn\.v_proj": 3, "mlp.*proj": 5,
               "^model.layers.2.k_proj": 7, "o_proj|gate": 9}
    modules = ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj",
               "model.layers.0.self_attn.v_proj", "model.layers.3.mlp.up_proj",
               "model.layers.2.k_proj", "xmodel.layers.2.k_proj", "model.layers.0.o_proj",
               "model.layers.0.xq_proj", "q_proj", "model.gate", "model.gate.x"]
    config = {"r": 1, "lora_alpha": 1, "rank_pattern": pattern}
    for m in modules:
        want = _peft_rule(pattern, m)
        assert configured_rank(config, m) == (pattern[want] if want else 1), m


# -- YAML --------------------------------------------------------------------------------------

BOMB = ("merge_method: linear\nmodels: [a]\ntokenizer_source: "
        "[&a [x, x, x, x, x, x, x, x, x], " + ", ".join(
            f"&{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]"
            for p, c in zip("abcdefg", "bcdefgh", strict=True)) + "]\n")  # 9^8 once expanded


def test_a_yaml_alias_bomb_is_refused_small_and_fast() -> None:
    """359 bytes of nested aliases made a 351 MB error body and 1.7 GB of RSS on 0.1."""
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequest, match="aliases") as e:
        parse_config(BOMB)
    assert time.perf_counter() - t0 < 1.0
    assert len(e.value.message) < 400


def test_the_alias_bomb_stays_under_a_memory_ceiling() -> None:
    """Peak RSS of a fresh process parsing the bomb (1.7 GB on 0.1): under 400 MB."""
    code = ("import sys\n"
            "from mergepipe.core.mergekit_config import parse_config\n"
            "try:\n    parse_config(sys.stdin.read())\nexcept Exception as e:\n"
            "    print(type(e).__name__)\n"
            # VmHWM: this process image's own peak (ru_maxrss would keep the forking pytest
            # process's RSS across exec)
            "print(next(int(line.split()[1]) for line in open('/proc/self/status')\n"
            "           if line.startswith('VmHWM:')))\n")
    out = subprocess.run([sys.executable, "-c", code], input=BOMB, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out[0] == "InvalidRequest" and int(out[1]) < 400 * 1024, out


@pytest.mark.parametrize("value", ["2024-01-01", "2001-12-14t21:59:43.10-05:00"])
def test_yaml_dates_stay_text(value: str) -> None:
    """A date was a datetime in 0.1 (500 when the request was encoded)."""
    with pytest.raises(InvalidRequest) as e:
        parse_config(f"merge_method: linear\nmodels:\n  - model: a\n    parameters:\n"
                     f"      weight: {value}\n  - model: b\n")
    assert "weight" in (e.value.field or "") or "weight" in e.value.message
    cfg = parse_config(f"merge_method: linear\nmodels:\n  - model: {value}\n"
                       "    parameters: {weight: 1}\n")
    assert cfg.experts[0].ref.text == value


def test_a_4300_digit_integer_in_yaml_is_a_4xx() -> None:
    with pytest.raises(InvalidRequest, match="digits"):
        parse_config("merge_method: linear\nmodels:\n  - model: a\n    parameters:\n"
                     f"      weight: {'9' * 4400}\n")


def test_error_messages_are_bounded() -> None:
    e = InvalidRequest("x" * 10**7, field="f" * 10**4)
    assert len(e.message) <= MAX_MESSAGE_CHARS and len(e.field or "") <= 200


# -- safetensors -------------------------------------------------------------------------------


def _raw(header: Mapping[str, object], data: bytes) -> bytes:
    js = json.dumps(header).encode()
    return struct.pack("<Q", len(js)) + js + data


@pytest.mark.parametrize("case,header,data", [
    ("gap", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
    ("trailing", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 12),
    ("overlap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
    ("hole", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
])
def test_tensors_must_tile_the_data_as_the_library_requires(
        tmp_path: Path, case: str, header: dict[str, object], data: bytes) -> None:
    p = tmp_path / f"{case}.safetensors"
    p.write_bytes(_raw(header, data))
    with pytest.raises(Exception), safe_open(str(p), "pt"):  # noqa: B017 - its own types vary
        pass
    with pytest.raises(InvalidCheckpoint, match="overlaps|gap|trailing"):
        read_header(p)


def test_exact_tiling_with_empty_tensors_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "ok.safetensors"
    save_file({"e": torch.zeros(0), "a": torch.ones(3), "z": torch.zeros(0, 2)}, str(p))
    assert {t.name for t in read_header(p).tensors} == {"e", "a", "z"}


def test_the_tensor_count_and_header_size_are_capped(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """300k empty tensors in an 18 MB header took 1.3 GB and 39 s on 0.1."""
    n = CheckpointLimits().max_tensors_per_file + 1
    header = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}
    p = tmp_path / "many.safetensors"
    p.write_bytes(_raw(header, b""))
    t0 = time.perf_counter()
    with pytest.raises(InvalidCheckpoint, match="over the limit"):
        read_header(p)
    assert time.perf_counter() - t0 < 5
    big = tmp_path / "big.safetensors"
    big.write_bytes(struct.pack("<Q", safetensors_format.MAX_HEADER_BYTES + 8) + b" " * 16)
    with pytest.raises(InvalidCheckpoint, match="exceeds"):
        read_header(big)


def test_index_files_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = factory.make_base(tmp_path / "sharded", seed=0, shards=2)
    monkeypatch.setattr(checkpoint, "MAX_INDEX_TENSORS", 3)
    with pytest.raises(InvalidCheckpoint, match="over the limit of 3"):
        open_checkpoint(d)
    monkeypatch.setattr(checkpoint, "MAX_JSON_BYTES", 64)
    with pytest.raises(InvalidCheckpoint, match="over the limit of 64"):
        open_checkpoint(d)


def test_block_bytes_is_capped(tmp_path: Path) -> None:
    """block_bytes up to 1 GiB was accepted on 0.1."""
    base = factory.make_base(tmp_path / "base", seed=0)
    with Catalog(new_catalog(tmp_path, "c")) as cat, pytest.raises(InvalidRequest,
                                                              match="block size") as e:
        ingest_model(cat, base, "base", block_bytes=1 << 30)
    assert e.value.field == "block_bytes"
