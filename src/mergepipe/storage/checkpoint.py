"""Locate the safetensors files of a checkpoint (file, sharded directory, LoRA adapter)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.storage import bounded_json
from mergepipe.storage.bounded_json import IntegerTooLong
from mergepipe.storage.locations import absolute, basename, is_url, join, parent, parse_url
from mergepipe.storage.safetensors_format import SafetensorsHeader, TensorEntry, read_header
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import FILE, Store

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
CONFIG_FILE = "config.json"
MAX_JSON_BYTES = 16 << 20  # an index or adapter config larger than this is refused
MAX_INDEX_TENSORS = 262_144  # entries of an index's weight_map
T = TypeVar("T")


@dataclass
class Checkpoint:
    """The tensors of a checkpoint in checkpoint order (file order, then offset)."""

    path: str  # absolute directory or file (or its URL) as given
    files: list[SafetensorsHeader]
    tensors: list[TensorEntry]
    extra_files: list[str] = field(default_factory=list)  # non-weight files (config, tokenizer)
    adapter_config: dict[str, object] | None = None  # PEFT LoRA adapters only
    is_dir: bool = True  # a directory (else a single .safetensors file)
    has_index: bool = False  # a sharded directory with model.safetensors.index.json

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}

    @property
    def directory(self) -> str:
        return self.path if self.is_dir else parent(self.path)


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read the headers of every file of the checkpoint at `path` (no tensor data)."""
    p = absolute(path)
    store = store_for(p)
    kind = _ask(store.kind, p)
    if kind is None:
        raise InvalidCheckpoint(f"{p}: no such file or directory", field="path")
    if kind == FILE:
        return _from_files(p, [p], [], is_dir=False)
    names = _ask(store.entries, p, "list")
    if ADAPTER_CONFIG in names:
        return _adapter(store, p)
    wm: dict[str, object] = {}
    if INDEX_FILE in names:
        shards, wm = _shards_from_index(store, p)
    elif SINGLE_FILE in names:
        shards = [join(p, SINGLE_FILE)]
    else:
        shards = sorted(join(p, n) for n in names if n.endswith(".safetensors"))
        if not shards:
            unlisted = (" (an HTTP directory cannot be listed: MergePipe looks for the names a "
                        "hub uses)" if is_url(p) and parse_url(p).scheme != "s3" else "")
            raise InvalidCheckpoint(f"{p}: no safetensors files (expected {SINGLE_FILE} or "
                                    f"{INDEX_FILE}){unlisted}", field="path")
    weights = {basename(s) for s in shards} | {INDEX_FILE}
    extra = sorted(join(p, n) for n, k in names.items()
                   if k == FILE and n not in weights and not n.endswith(".safetensors"))
    ckpt = _from_files(p, shards, extra, has_index=INDEX_FILE in names)
    if names.get(CONFIG_FILE) == FILE:
        _check_config(store, join(p, CONFIG_FILE))
    if INDEX_FILE in names:
        _check_index(p, wm, ckpt)
    return ckpt


def _check_config(store: Store, p: str) -> None:
    """Refuse a config.json no merge could rewrite (integers, nesting); bad JSON is copied."""
    try:
        bounded_json.loads(store.read_bytes(p, MAX_JSON_BYTES))
    except (IntegerTooLong, RecursionError) as e:
        why = str(e) if isinstance(e, IntegerTooLong) else "nested too deeply"
        raise InvalidCheckpoint(f"{p}: {why}", field="path") from None
    except (OSError, ValueError):
        pass


def _ask(call: Callable[[str], T], p: str, what: str = "open") -> T:
    """A store's answer about `p`; its OSError as InvalidCheckpoint ("cannot open" / "list")."""
    try:
        return call(p)
    except OSError as e:
        raise InvalidCheckpoint(f"{p}: cannot {what} ({e.strerror})", field="path") from None


def _shards_from_index(store: Store, p: str) -> tuple[list[str], dict[str, object]]:
    """The shard files of an index, and its weight_map."""
    index_path = join(p, INDEX_FILE)
    index = _load_json(store, index_path)
    wm = index.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise InvalidCheckpoint(f"{index_path}: missing or empty weight_map")
    if len(wm) > MAX_INDEX_TENSORS:
        raise InvalidCheckpoint(f"{index_path}: {len(wm)} tensors in the weight_map, over the "
                                f"limit of {MAX_INDEX_TENSORS}")
    names = sorted(set(map(str, wm.values())))
    shards = []
    for n in names:
        if not n or os.path.isabs(n) or "/" in n or n in (".", "..") or "\x00" in n:
            raise InvalidCheckpoint(f"{index_path}: shard {n!r} is outside the checkpoint")
        s = join(p, n)
        if _ask(store.kind, s) != FILE:
            raise InvalidCheckpoint(f"{index_path}: points at missing shard {n!r}")
        shards.append(s)
    return shards, wm


def _check_index(p: str, wm: dict[str, object], ckpt: Checkpoint) -> None:
    index_path = join(p, INDEX_FILE)
    actual = {t.name: basename(t.file) for t in ckpt.tensors}
    for name, shard in wm.items():
        if actual.get(name) != shard:
            raise InvalidCheckpoint(
                f"{index_path}: tensor {name!r} mapped to {shard!r} but "
                f"{'found in ' + repr(actual[name]) if name in actual else 'not found in any shard'}")
    extra = sorted(actual.keys() - wm.keys())
    if extra:
        raise InvalidCheckpoint(f"{index_path}: tensor {extra[0]!r} (in "
                                f"{actual[extra[0]]!r}) is not in the weight_map")


def _adapter(store: Store, p: str) -> Checkpoint:
    cfg_path = join(p, ADAPTER_CONFIG)
    cfg = _load_json(store, cfg_path)
    weights = join(p, ADAPTER_WEIGHTS)
    if _ask(store.kind, weights) != FILE:
        raise InvalidCheckpoint(f"{p}: {ADAPTER_CONFIG} without {ADAPTER_WEIGHTS}")
    ckpt = _from_files(p, [weights], [cfg_path])
    ckpt.adapter_config = cfg
    return ckpt


def _from_files(path: str, files: list[str], extra: list[str], *, is_dir: bool = True,
                has_index: bool = False) -> Checkpoint:
    headers = [read_header(f) for f in files]
    tensors: list[TensorEntry] = []
    seen: dict[str, str] = {}
    for h in headers:
        for t in h.tensors:
            if t.name in seen:
                raise InvalidCheckpoint(f"tensor {t.name!r} appears in both {seen[t.name]} and {h.path}")
            seen[t.name] = h.path
            tensors.append(t)
    return Checkpoint(path, headers, tensors, extra, is_dir=is_dir, has_index=has_index)


def _load_json(store: Store, p: str) -> dict[str, object]:
    if _ask(store.kind, p) != FILE:  # a FIFO or a device would block or never end
        raise InvalidCheckpoint(f"{p}: not a regular file")
    try:
        data = bounded_json.loads(store.read_bytes(p, MAX_JSON_BYTES).decode())
    except OSError as e:
        raise InvalidCheckpoint(f"{p}: not readable JSON ({e.strerror})") from None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError, IntegerTooLong
        raise InvalidCheckpoint(f"{p}: not readable JSON ({e})") from None
    except RecursionError:
        raise InvalidCheckpoint(f"{p}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidCheckpoint(f"{p}: not a JSON object")
    return data
