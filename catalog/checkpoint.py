"""Locate the safetensors files of a checkpoint (single file, sharded HF directory, LoRA adapter)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from mergepipe.catalog.safetensors_format import SafetensorsHeader, TensorEntry, read_header
from mergepipe.core.errors import InvalidCheckpoint

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass
class Checkpoint:
    """The tensors of a checkpoint in checkpoint order (file order, then offset)."""

    path: str  # absolute directory or file as given
    files: list[SafetensorsHeader]
    tensors: list[TensorEntry]
    extra_files: list[str] = field(default_factory=list)  # non-weight files (config, tokenizer)
    adapter_config: dict[str, object] | None = None  # PEFT LoRA adapters only

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}

    @property
    def directory(self) -> str:
        return self.path if os.path.isdir(self.path) else os.path.dirname(self.path)


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read the headers of every file of the checkpoint at `path`; no tensor data is read."""
    p = Path(path).absolute()
    if not p.exists():
        raise InvalidCheckpoint(f"{p}: no such file or directory", field="path")
    if p.is_file():
        return _from_files(str(p), [p], [])
    if (p / ADAPTER_CONFIG).exists():
        return _adapter(p)
    if (p / INDEX_FILE).exists():
        shards = _shards_from_index(p)
    elif (p / SINGLE_FILE).exists():
        shards = [p / SINGLE_FILE]
    else:
        shards = sorted(p.glob("*.safetensors"))
        if not shards:
            raise InvalidCheckpoint(f"{p}: no safetensors files (expected {SINGLE_FILE} or "
                                    f"{INDEX_FILE})", field="path")
    weights = {s.name for s in shards} | {INDEX_FILE}
    extra = sorted(str(f) for f in p.iterdir()
                   if f.is_file() and f.name not in weights and not f.name.endswith(".safetensors"))
    ckpt = _from_files(str(p), shards, extra)
    if (p / INDEX_FILE).exists():
        _check_index(p, ckpt)
    return ckpt


def _shards_from_index(p: Path) -> list[Path]:
    index = _load_json(p / INDEX_FILE)
    wm = index.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise InvalidCheckpoint(f"{p / INDEX_FILE}: missing or empty weight_map")
    names = sorted(set(map(str, wm.values())))
    shards = []
    for n in names:
        s = (p / n)
        if os.path.isabs(n) or ".." in Path(n).parts or s.parent != p:
            raise InvalidCheckpoint(f"{p / INDEX_FILE}: shard {n!r} is outside the checkpoint")
        if not s.is_file():
            raise InvalidCheckpoint(f"{p / INDEX_FILE}: points at missing shard {n!r}")
        shards.append(s)
    return shards


def _check_index(p: Path, ckpt: Checkpoint) -> None:
    wm = _load_json(p / INDEX_FILE)["weight_map"]
    assert isinstance(wm, dict)  # checked by _shards_from_index
    actual = {t.name: os.path.basename(t.file) for t in ckpt.tensors}
    for name, shard in wm.items():
        if actual.get(name) != shard:
            raise InvalidCheckpoint(
                f"{p / INDEX_FILE}: tensor {name!r} mapped to {shard!r} but "
                f"{'found in ' + repr(actual[name]) if name in actual else 'not found in any shard'}")
    extra = sorted(actual.keys() - wm.keys())
    if extra:
        raise InvalidCheckpoint(f"{p / INDEX_FILE}: tensor {extra[0]!r} (in "
                                f"{actual[extra[0]]!r}) is not in the weight_map")


def _adapter(p: Path) -> Checkpoint:
    cfg = _load_json(p / ADAPTER_CONFIG)
    weights = p / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise InvalidCheckpoint(f"{p}: {ADAPTER_CONFIG} without {ADAPTER_WEIGHTS}")
    ckpt = _from_files(str(p), [weights], [str(p / ADAPTER_CONFIG)])
    ckpt.adapter_config = cfg
    return ckpt


def _from_files(path: str, files: list[Path], extra: list[str]) -> Checkpoint:
    headers = [read_header(f) for f in files]
    tensors: list[TensorEntry] = []
    seen: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in seen:
                raise InvalidCheckpoint(f"tensor {t.name!r} appears in both {seen[t.name]} and {h.path}")
            seen[t.name] = h.path
            tensors.append(t)
    return Checkpoint(path, headers, tensors, extra)


def _load_json(p: Path) -> dict[str, object]:
    if not p.is_file():  # a FIFO or a device would block or never end
        raise InvalidCheckpoint(f"{p}: not a regular file")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidCheckpoint(f"{p}: not readable JSON ({e})") from None
    except RecursionError:
        raise InvalidCheckpoint(f"{p}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidCheckpoint(f"{p}: not a JSON object")
    return data
