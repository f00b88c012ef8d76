"""PEFT LoRA adapters: map keys to base tensors, per-module scale, and the block delta rule."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import re2

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.storage.safetensors_format import TensorEntry

if TYPE_CHECKING:
    import torch

# base_model.model.<module>.lora_A.weight (PEFT's saved form; an adapter name may sit before
# .weight in unsaved state dicts).
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")
_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraTarget:
    """One base tensor covered by the adapter: its lora_A / lora_B and its scale."""

    tensor: str  # base tensor name, <module>.weight
    module: str
    a: TensorEntry  # (r, in_features)
    b: TensorEntry  # (out_features, r)
    rank: int
    alpha: float
    scale: float


def lora_delta(b_rows: torch.Tensor, a: torch.Tensor, scale: float) -> torch.Tensor:
    """The float32 delta of some rows of a LoRA tensor: scale * (B[rows] @ A)."""
    import torch

    return torch.mm(b_rows, a).mul_(scale)


def adapter_scale(config: Mapping[str, object], module: str, rank: int) -> tuple[float, float]:
    """(alpha, scale) of one module: alpha_pattern / lora_alpha over r (or sqrt(r) with rslora)."""
    alpha = _number(config, "lora_alpha")
    pattern = _pattern(config, "alpha_pattern")
    key = _pattern_key(pattern, module, "alpha_pattern")
    if key is not None:
        alpha = _as_number(pattern[key], f"alpha_pattern[{key!r}]")
    if config.get("use_rslora"):
        return alpha, alpha / math.sqrt(rank)
    return alpha, alpha / rank


def configured_rank(config: Mapping[str, object], module: str) -> int:
    """The rank the config gives a module (rank_pattern, else r)."""
    pattern = _pattern(config, "rank_pattern")
    key = _pattern_key(pattern, module, "rank_pattern")
    r = pattern[key] if key is not None else config.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise InvalidCheckpoint(f"adapter_config.json: rank {r!r} for module {module!r} is not a "
                                "positive integer", field="r")
    return r


def check_config(config: Mapping[str, object], where: str) -> None:
    """Refuse adapter features whose delta is not scale * B @ A on a 2-D weight."""
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise InvalidCheckpoint(f"{where}: peft_type {peft_type!r} is not supported (LORA only)",
                                field="peft_type")
    _number(config, "lora_alpha")
    if config.get("fan_in_fan_out"):
        raise InvalidCheckpoint(f"{where}: fan_in_fan_out adapters (Conv1D / GPT-2 style weights) "
                                "are not supported", field="fan_in_fan_out")
    if config.get("use_dora"):
        raise InvalidCheckpoint(f"{where}: DoRA adapters (use_dora) are not supported: their "
                                "delta is not scale * B @ A", field="use_dora")
    bias = config.get("bias", "none")
    if bias not in (None, "none"):
        raise InvalidCheckpoint(f"{where}: adapters that train biases (bias={bias!r}) are not "
                                "supported", field="bias")
    if config.get("lora_bias"):
        raise InvalidCheckpoint(f"{where}: adapters with a lora_B bias (lora_bias) are not "
                                "supported", field="lora_bias")


def lora_targets(config: Mapping[str, object], tensors: list[TensorEntry],
                 base_shapes: Mapping[str, tuple[int, ...]], where: str) -> list[LoraTarget]:
    """Pair lora_A / lora_B per module, map to base tensors and check shapes against the base."""
    check_config(config, where)
    pairs: dict[str, dict[str, TensorEntry]] = {}
    for t in tensors:
        m = _KEY.match(t.name)
        if m is None:
            raise InvalidCheckpoint(f"{where}: tensor {t.name!r}: {_unsupported_key(t.name)}")
        pairs.setdefault(m.group("module"), {})[m.group("ab")] = t
    out = []
    for module, ab in pairs.items():
        if "A" not in ab or "B" not in ab:
            missing = "lora_A" if "A" not in ab else "lora_B"
            raise InvalidCheckpoint(f"{where}: module {module!r} has no {missing} tensor")
        a, b = ab["A"], ab["B"]
        tensor = f"{module}.weight"
        _check_shapes(module, tensor, a, b, base_shapes.get(tensor), where)
        rank = a.shape[0]
        want = configured_rank(config, module)
        if rank != want:
            raise InvalidCheckpoint(f"{where}: module {module!r}: lora_A has rank {rank} but "
                                    f"adapter_config.json says r={want}", field="r")
        alpha, scale = adapter_scale(config, module, rank)
        out.append(LoraTarget(tensor, module, a, b, rank, alpha, scale))
    if not out:
        raise InvalidCheckpoint(f"{where}: the adapter has no lora_A / lora_B tensors")
    return out


def _check_shapes(module: str, tensor: str, a: TensorEntry, b: TensorEntry,
                  shape: tuple[int, ...] | None, where: str) -> None:
    """lora_B @ lora_A has the shape of the 2-D base tensor."""
    if shape is None:
        raise InvalidCheckpoint(f"{where}: module {module!r}: the base has no tensor "
                                f"{tensor!r}")
    if len(shape) != 2:
        raise InvalidCheckpoint(f"{where}: tensor {tensor!r} has shape {list(shape)} in the "
                                "base; LoRA needs a 2-D weight")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise InvalidCheckpoint(f"{where}: module {module!r}: lora_A {list(a.shape)} and "
                                f"lora_B {list(b.shape)} must be 2-D")
    if a.shape[1] != shape[1] or b.shape[0] != shape[0] or b.shape[1] != a.shape[0]:
        raise InvalidCheckpoint(
            f"{where}: module {module!r}: lora_B {list(b.shape)} @ lora_A {list(a.shape)} "
            f"does not fit base tensor {tensor!r} of shape {list(shape)}")


def _unsupported_key(name: str) -> str:
    if "lora_embedding_A" in name or "lora_embedding_B" in name:
        return "embedding LoRA (lora_embedding_A/B) is not supported"
    if "lora_magnitude_vector" in name:
        return "DoRA (lora_magnitude_vector) is not supported"
    if ".lora_B" in name and name.endswith(".bias"):
        return "a lora_B bias is not supported"
    if name.endswith(".bias"):
        return "trained biases are not supported"
    if not name.startswith(_PREFIX):
        return f"not a PEFT LoRA key (expected {_PREFIX}<module>.lora_A.weight)"
    return "not a lora_A / lora_B weight (modules_to_save and other extras are not supported)"


MAX_PATTERNS = 4096  # keys of one rank_pattern / alpha_pattern
MAX_PATTERN_CHARS = 1024
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.max_mem = 8 << 20  # a pattern whose automaton is bigger is refused


def _pattern(config: Mapping[str, object], name: str) -> dict[str, object]:
    p = config.get(name) or {}
    if not isinstance(p, dict):
        raise InvalidCheckpoint(f"adapter_config.json: {name} is not an object", field=name)
    if len(p) > MAX_PATTERNS:
        raise InvalidCheckpoint(f"adapter_config.json: {name} has {len(p)} keys, over the "
                                f"limit of {MAX_PATTERNS}", field=name)
    return p


def _pattern_key(pattern: Mapping[str, object], module: str, name: str) -> str | None:
    r"""The pattern key PEFT would use for `module` (first match of `(.*\.)?(key)$`), run by RE2."""
    for key in pattern:
        if len(key) > MAX_PATTERN_CHARS:
            raise InvalidCheckpoint(f"adapter_config.json: {name} key {key[:60]!r}... is over "
                                    f"{MAX_PATTERN_CHARS} characters", field=name)
        try:
            rx = re2.compile(rf"(.*\.)?({key})$", _RE2_OPTIONS)
        except re2.error as e:
            raise InvalidCheckpoint(f"adapter_config.json: {name} key {key!r} is not a regular "
                                    f"expression MergePipe runs (RE2 syntax, linear time: no "
                                    f"back-references or look-arounds): {_reason(e)}",
                                    field=name) from None
        if rx.match(module):
            return key
    return None


def _reason(e: Exception) -> str:
    arg = e.args[0] if e.args else e
    return (arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg))[:200]


def _number(config: Mapping[str, object], name: str) -> float:
    if name not in config:
        raise InvalidCheckpoint(f"adapter_config.json: {name} is missing", field=name)
    return _as_number(config[name], name)


def _as_number(v: object, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise InvalidCheckpoint(f"adapter_config.json: {name} {v!r} is not a finite number",
                                field=name)
    return float(v)
