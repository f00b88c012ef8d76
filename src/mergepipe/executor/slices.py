"""Write a passthrough `slices:` merge: each output layer copied from its slice's source layer,
renumbered from 0; the tensors outside the layers from the first slice's source (embeddings)
or the last one's (final norm, lm_head), as mergekit takes them. mergekit's bytes: each tensor
cast to the compute dtype, times its `scale`, cast to the written dtype, as mergekit does."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import xxhash

from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest, SourceChanged
from mergepipe.core.mergekit_slices import LAYER_KEYS, Slice, SliceConfig
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.vocab import HF_DTYPE_NAMES
from mergepipe.executor.side_files import CONFIG_FILE, SIDE_FILES, copy_side_files, read_config
from mergepipe.executor.stream import output_hash
from mergepipe.executor.writer import OutputTensor, nonfinite_output
from mergepipe.storage.checkpoint import Checkpoint, open_checkpoint
from mergepipe.storage.locations import basename
from mergepipe.storage.safetensors_format import TensorEntry, torch_dtype
from mergepipe.storage.storage import RangeReader, open_reader
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import Stamp

_LAYER = re.compile(r"^(.*?)\.(\d+)\.(.+)$")  # the first numeric component: model.layers.N.rest
# the tensors mergekit's architectures take before the layers (embeddings), from the first slice
_PRE = re.compile(r"(^|\.)(emb(?!ed_out)\w*|wte|wpe|tok_embeddings|word_embeddings|"
                  r"rotary_pos_emb|relative_pe)\.")


_DTYPE_NAMES = {getattr(torch, v): k for k, v in HF_DTYPE_NAMES.items()}  # torch -> F32...


@dataclass(frozen=True)
class SliceResult:
    layers: int
    bytes_read: int  # tensor bytes read from the sources (fetched, for remote ones)
    side_files: list[str]
    written: list[OutputTensor]  # with their content hashes
    bytes_by_source: dict[str, int]
    exec_seconds: float = 0.0

    @property
    def tensors(self) -> int:
        return len(self.written)

    @property
    def output_hash(self) -> str:
        return output_hash(self.written)


class _Checkpoint:
    """The tensors of one checkpoint (a local directory, or a remote one: s3://, https://,
    hf://), by name; their bytes read by range through the storage layer's reader."""

    def __init__(self, path: str, key: str, reader: RangeReader,
                 opened: Checkpoint | None = None) -> None:
        try:
            self.ckpt = opened or open_checkpoint(path)
        except InvalidCheckpoint as e:
            raise InvalidCheckpoint(f"{key}: {e.message}", field=key) from None
        if not self.ckpt.tensors:
            raise InvalidCheckpoint(f"{key}: {path} holds no tensor", field=key)
        self.key, self.reader = key, reader
        self.where: dict[str, TensorEntry] = self.ckpt.by_name()

    def get(self, name: str) -> torch.Tensor:
        return read_tensor(self.reader, self.where[name])

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


def read_tensor(reader: RangeReader, t: TensorEntry) -> torch.Tensor:
    """A tensor of a checkpoint, read whole by range."""
    raw = reader.read(t.file, t.data_offset, t.nbytes)
    if not raw:
        return torch.empty(t.shape, dtype=torch_dtype(t.dtype))
    return torch.frombuffer(raw, dtype=torch_dtype(t.dtype)).reshape(t.shape)


def edit_config(out_dir: Path, keys: Sequence[str], value: int) -> None:
    """Set the output's config.json's first of `keys` it has (else the first) to `value`."""
    path = out_dir / CONFIG_FILE
    if path.is_file():
        doc = json.loads(path.read_text())
        doc[next((k for k in keys if k in doc), keys[0])] = value
        path.write_text(json.dumps(doc, indent=2) + "\n")


SHARD_BYTES = 2 << 30  # tensors held in memory before a shard is written


def write_slices(cfg: SliceConfig, paths: Mapping[str, str], out_dir: Path, *,
                 shard_bytes: int = SHARD_BYTES, pins: Mapping[str, Stamp] | None = None,
                 opened: Mapping[str, Checkpoint] | None = None,
                 progress: ProgressFn | None = None) -> SliceResult:
    """Write the merge of `cfg` into `out_dir`, reading by range only the tensors taken from
    `paths` (each model as written -> its checkpoint). `pins`: each file must be read at that
    version (SourceChanged if not); `opened`: the headers already read, by model. Written in
    shards of about `shard_bytes`, so memory holds one shard at a time."""
    t0 = time.perf_counter()
    with open_reader(random_access=True) as reader:
        ckpts = {m: _Checkpoint(p, m, reader, (opened or {}).get(m)) for m, p in paths.items()}
        _pin(ckpts.values(), reader, pins or {})
        out_dir.mkdir(parents=True, exist_ok=True)
        shards = _Shards(out_dir, shard_bytes)
        todo = list(_assignments(cfg, ckpts))
        told = 0.0
        for i, (name, piece, source, t, src_name) in enumerate(todo):
            shards.add(name, _value(cfg, piece, name, t, ckpts[source].get(src_name)))
            if progress is not None and (i + 1 == len(todo) or time.monotonic() - told > 0.5):
                told = time.monotonic()
                progress(Progress(i + 1, len(todo), "blocks", base_bytes_read=reader.bytes_read))
        shards.finish()
        by_file = reader.bytes_by_path
        read = reader.bytes_read
    by_source = {m: sum(by_file.get(f.path, 0) for f in c.ckpt.files) for m, c in ckpts.items()}
    # (a compute dtype is given only with a written dtype, mergekit's `dtype` or `out_dtype`)
    side = copy_side_files([p for p in ckpts[cfg.donor].ckpt.extra_files
                            if basename(p) in SIDE_FILES], out_dir, cfg.output_dtype)
    edit_config(out_dir, LAYER_KEYS, cfg.layers)
    _stack_layer_types(out_dir, cfg, ckpts)
    return SliceResult(cfg.layers, read, side.copied, shards.written, by_source,
                       time.perf_counter() - t0)


LAYER_TYPES = "layer_types"  # config.json's one entry per layer (attention kind), transformers 5


def _stack_layer_types(out_dir: Path, cfg: SliceConfig, ckpts: Mapping[str, _Checkpoint]
                       ) -> None:
    """The output config's `layer_types`, when it has one: each slice's source's entries of
    its layers, in order (a list of another length than the layers fails transformers'
    checks). A source without such a list: the key is dropped (transformers derives it)."""
    path = out_dir / CONFIG_FILE
    doc = json.loads(path.read_text()) if path.is_file() else None
    if not isinstance(doc, dict) or not isinstance(doc.get(LAYER_TYPES), list):
        return
    stacked: list[Any] = []
    for piece in cfg.slices:
        src = piece.sources[0]
        kinds = (read_config(ckpts[src.model].ckpt.extra_files) or {}).get(LAYER_TYPES)
        if not isinstance(kinds, list) or len(kinds) < src.end:
            del doc[LAYER_TYPES]
            break
        stacked += kinds[src.start:src.end]
    else:
        doc[LAYER_TYPES] = stacked
    path.write_text(json.dumps(doc, indent=2) + "\n")


def output_count(cfg: SliceConfig, opened: Mapping[str, Checkpoint]) -> int:
    """How many tensors the merge writes (InvalidRequest naming a layer_range past a source's
    layers); from the headers only."""
    with open_reader() as reader:
        ckpts = {m: _Checkpoint(c.path, m, reader, c) for m, c in opened.items()}
        return sum(1 for _ in _assignments(cfg, ckpts))


def _pin(ckpts: Iterable[_Checkpoint], reader: RangeReader, pins: Mapping[str, Stamp]) -> None:
    """Pin the reads of each source file to its version now; SourceChanged for a file that is
    not the one `pins` recorded."""
    seen: set[str] = set()
    for c in ckpts:
        for f in c.ckpt.files:
            if f.path in seen:
                continue
            try:
                now = store_for(f.path).stat(f.path)
            except OSError as e:
                raise SourceChanged(f"{c.key}: {f.path} is not readable ({e.strerror})") from None
            was = pins.get(f.path)
            change = None if was is None else now.change_from(was)
            if change is not None:
                raise SourceChanged(f"{c.key}: {f.path} changed since the merge ({change})")
            reader.pin(f.path, was or now)
            seen.add(f.path)


def require_finite(name: str, tensor: torch.Tensor) -> None:
    """Refuse an output tensor holding Inf or NaN before it is written (as the writer does)."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise nonfinite_output(name, str(tensor.dtype).removeprefix("torch."))


class _Shards:
    """Output tensors written shard by shard; named model-0000i-of-0000N with an index when
    there are several (the Hugging Face layout)."""

    def __init__(self, out_dir: Path, limit: int) -> None:
        self.out_dir, self.limit = out_dir, limit
        self.pending: dict[str, torch.Tensor] = {}
        self.files: list[Path] = []
        self.where: dict[str, int] = {}  # tensor -> shard
        self.written: list[OutputTensor] = []
        self.size = self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        require_finite(name, tensor)
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
        self.written += [hashed_tensor(n, t, path.name) for n, t in self.pending.items()]
        self.files.append(path)
        self.pending, self.size = {}, 0

    def finish(self) -> None:
        """Name the shards (and write the index of several)."""
        if self.pending or not self.files:
            self._flush()
        n = len(self.files)
        names = (["model.safetensors"] if n == 1 else
                 [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        renamed = {p.name: names[i] for i, p in enumerate(self.files)}
        self.written = [replace(t, file=renamed[t.file]) for t in self.written]
        for path, final in zip(self.files, names, strict=True):
            path.rename(self.out_dir / final)
        if n > 1:
            index = {"metadata": {"total_size": self.total},
                     "weight_map": {k: names[i] for k, i in self.where.items()}}
            (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def hashed_tensor(name: str, t: torch.Tensor, file: str) -> OutputTensor:
    """A written tensor and the xxh3-128 of its bytes (as the executor hashes its outputs)."""
    raw: Any = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""  # no copy
    return OutputTensor(name, _DTYPE_NAMES[t.dtype], tuple(t.shape), file,
                        xxhash.xxh3_128_hexdigest(raw))


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
    head, tail = first.sources[0].model, last.sources[0].model
    for name in ckpts[head].outer():
        if _PRE.search(name):
            yield name, first, head, 0.0, name
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
    for name in ckpts[tail].outer():
        if not _PRE.search(name):
            yield name, last, tail, 0.0, name
