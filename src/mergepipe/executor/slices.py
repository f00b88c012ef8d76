"""Write a passthrough `slices:` merge: each output layer copied from its slice's source layer,
renumbered from 0; the tensors outside the layers from the first slice's source (embeddings)
or the last one's (final norm, lm_head), as mergekit takes them.

The output equals mergekit's byte for byte: each tensor is read, cast to the compute dtype
(mergekit's `dtype`, when given), multiplied by its `scale` (when one applies) and cast to the
written dtype, the same torch operations in the same order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest
from mergepipe.core.mergekit_slices import LAYER_KEYS, Slice, SliceConfig
from mergepipe.core.vocab import HF_DTYPE_NAMES
from mergepipe.executor.side_files import CONFIG_FILE, SIDE_FILES, copy_side_files
from mergepipe.storage.safetensors_format import torch_dtype

_LAYER = re.compile(r"^(.*?)\.(\d+)\.(.+)$")  # the first numeric component: model.layers.N.rest
# the components of the tensors mergekit's architectures take before the layers (embeddings)
_PRE = re.compile(r"(^|\.)(emb(?!ed_out)\w*|wte|wpe|tok_embeddings|word_embeddings|"
                  r"rotary_pos_emb|relative_pe)\.")


@dataclass(frozen=True)
class SliceResult:
    output: str
    tensors: int
    layers: int
    bytes_read: int
    side_files: list[str]

    def to_dict(self) -> dict[str, object]:
        return {"output": self.output, "operator": "passthrough", "tensors": self.tensors,
                "layers": self.layers, "bytes_read": self.bytes_read,
                "side_files": self.side_files}


class _Checkpoint:
    """The tensors of one local safetensors checkpoint directory, by name."""

    def __init__(self, path: str, key: str) -> None:
        from safetensors import safe_open

        self.path, self.files = Path(path), sorted(Path(path).glob("*.safetensors"))
        if not self.files:
            raise InvalidCheckpoint(f"{key}: {path} holds no .safetensors file")
        self.where: dict[str, Path] = {}
        for f in self.files:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    self.where[name] = f

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.where[name]), framework="pt") as h:
            return h.get_tensor(name)

    def layers(self) -> dict[int, list[tuple[str, str]]]:
        """layer index -> [(tensor name, name inside the layer)], in file order."""
        out: dict[int, list[tuple[str, str]]] = {}
        for name in self.where:
            m = _LAYER.match(name)
            if m:
                out.setdefault(int(m.group(2)), []).append((name, m.group(3)))
        return out

    def outer(self) -> list[str]:
        return [n for n in self.where if not _LAYER.match(n)]


SHARD_BYTES = 2 << 30  # tensors held in memory before a shard is written


def write_slices(cfg: SliceConfig, paths: Mapping[str, str], out_dir: Path, *,
                 shard_bytes: int = SHARD_BYTES) -> SliceResult:
    """Write the merge of `cfg` into `out_dir`; `paths` maps each model as written in the config
    to its local checkpoint directory. Tensors are written in shards of about `shard_bytes`
    (one file, model.safetensors, when they fit), so memory holds one shard at a time."""
    ckpts = {m: _Checkpoint(p, m) for m, p in paths.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = _Shards(out_dir, shard_bytes)
    read = 0
    for name, piece, source, t, src_name in _assignments(cfg, ckpts):
        x = ckpts[source].get(src_name)
        read += x.numel() * x.element_size()
        shards.add(name, _value(cfg, piece, name, t, x))
    count = shards.finish()
    donor = Path(paths[cfg.donor])
    dtype = cfg.output_dtype or (None if cfg.compute_dtype == "files" else
                                 next(k for k, v in HF_DTYPE_NAMES.items()
                                      if v == cfg.compute_dtype))
    side = copy_side_files([str(donor / n) for n in SIDE_FILES if (donor / n).is_file()],
                           out_dir, dtype)
    config = out_dir / CONFIG_FILE
    if config.is_file():
        doc = json.loads(config.read_text())
        doc[next((k for k in LAYER_KEYS if k in doc), LAYER_KEYS[0])] = cfg.layers
        config.write_text(json.dumps(doc, indent=2) + "\n")
    return SliceResult(str(out_dir), count, cfg.layers, read, side.copied)


class _Shards:
    """Output tensors written shard by shard; named model-0000i-of-0000N with an index when
    there are several (the Hugging Face layout)."""

    def __init__(self, out_dir: Path, limit: int) -> None:
        self.out_dir, self.limit = out_dir, limit
        self.pending: dict[str, torch.Tensor] = {}
        self.files: list[Path] = []
        self.where: dict[str, int] = {}  # tensor -> shard
        self.size = self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.size + nbytes > self.limit:
            self._flush()
        self.pending[name] = tensor
        self.size += nbytes
        self.total += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.out_dir / f".shard-{len(self.files)}.safetensors"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.where.update(dict.fromkeys(self.pending, len(self.files)))
        self.files.append(path)
        self.pending, self.size = {}, 0

    def finish(self) -> int:
        """Name the shards; the number of tensors written."""
        if self.pending or not self.files:
            self._flush()
        n = len(self.files)
        if n == 1:
            self.files[0].rename(self.out_dir / "model.safetensors")
            return len(self.where)
        names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for path, final in zip(self.files, names, strict=True):
            path.rename(self.out_dir / final)
        index = {"metadata": {"total_size": self.total},
                 "weight_map": {k: names[i] for k, i in self.where.items()}}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return len(self.where)


def _value(cfg: SliceConfig, piece: Slice, name: str, t: float, x: torch.Tensor
           ) -> torch.Tensor:
    if cfg.compute_dtype != "files":
        x = x.to(getattr(torch, cfg.compute_dtype))
    scale = cfg.scale_of(piece, name, t)
    if scale is not None:
        x = x * scale
    if cfg.output_dtype is not None:
        x = x.to(torch_dtype(cfg.output_dtype))
    return x.contiguous()


def _assignments(cfg: SliceConfig, ckpts: Mapping[str, _Checkpoint]
                 ) -> Iterator[tuple[str, Slice, str, float, str]]:
    """(output tensor, its slice, source model, t, source tensor) for every output tensor."""
    first, last = cfg.slices[0], cfg.slices[-1]
    head = ckpts[first.sources[0].model]
    for name in head.outer():
        if _is_pre(name):
            yield name, first, first.sources[0].model, 0.0, name
    index = 0
    for piece in cfg.slices:
        src = piece.sources[0]
        layers = ckpts[src.model].layers()
        for offset in range(piece.layers):
            at = src.start + offset
            if at not in layers:
                raise InvalidRequest(f"{src.key}.layer_range: {src.model} has no layer {at} "
                                     f"(it has {len(layers)})", field=f"{src.key}.layer_range")
            t = offset / (piece.layers - 1) if piece.layers > 1 else 1.0
            for name, rest in layers[at]:
                prefix = _LAYER.match(name).group(1)  # type: ignore[union-attr]
                yield f"{prefix}.{index}.{rest}", piece, src.model, t, name
            index += 1
    tail_model = last.sources[0].model
    tail = ckpts[tail_model]
    for name in tail.outer():
        if not _is_pre(name):
            yield name, last, tail_model, 0.0, name


def _is_pre(name: str) -> bool:
    """The tensors mergekit takes before the layers (embeddings) from the first slice."""
    return _PRE.search(name) is not None
