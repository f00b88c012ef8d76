"""Synthetic Llama checkpoint families (base + experts) with deltas structured like fine-tunes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from mergepipe.core.vocab import DTYPE_SIZES, HF_DTYPE_NAMES, normalize_dtype
from mergepipe.storage.safetensors_format import encode_header, torch_dtype

FAMILY_FILE = "family.json"
CHUNK_ELEMS = 1 << 22  # rows generated at a time: bounded memory whatever the tensor size
BASE_STD = 0.02  # init-like std of the base's matrices
DELTA_REL = 0.01  # median delta std relative to BASE_STD: ~1.6 bf16 ulps at |w| ~ 0.02
SCALE_SIGMA = 0.6  # log-normal spread of per-(expert, tensor) delta scales
FOCUS_LAYERS = 2  # layers per expert with larger updates
FOCUS_GAIN = 6.0
RANK = 8  # rank of the structured part of a full expert's delta
LOWRANK_SHARE = 0.6  # share of the delta's variance in the low-rank part
LORA_RANK = 16
LORA_TARGETS = ("q_proj", "v_proj")
HIDDEN_SIZES = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


@dataclass(frozen=True)
class LlamaShape:
    """Dimensions of a LlamaForCausalLM; tensors() lists its weights in HF order."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [(p + "input_layernorm.weight", (h,)),
                    (p + "self_attn.q_proj.weight", (h, h)),
                    (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)),
                    (p + "self_attn.o_proj.weight", (h, h)),
                    (p + "post_attention_layernorm.weight", (h,)),
                    (p + "mlp.gate_proj.weight", (self.intermediate, h)),
                    (p + "mlp.up_proj.weight", (self.intermediate, h)),
                    (p + "mlp.down_proj.weight", (h, self.intermediate))]
        return out + [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab, h))]

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for _, s in self.tensors())

    def config(self, dtype: str) -> dict[str, Any]:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "vocab_size": self.vocab, "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
                "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                "initializer_range": BASE_STD, "bos_token_id": 1, "eos_token_id": 2,
                "dtype": HF_DTYPE_NAMES[dtype]}


def shape_for_size(size_mb: float, itemsize: int = 2) -> LlamaShape:
    """The widest Llama shape whose depth is still >= hidden/96 and whose size is ~size_mb."""
    target = size_mb * 1e6 / itemsize
    best = None
    for h in HIDDEN_SIZES:
        heads = max(1, h // 64)
        kv_heads = max(1, heads // 4)
        inter = max(64, round(h * 8 / 3 / 64) * 64)
        vocab = min(32000, h * h // 16)
        kv = kv_heads * (h // heads)
        per_layer = 2 * h * h + 2 * kv * h + 3 * h * inter + 2 * h
        layers = round((target - 2 * vocab * h - h) / per_layer)
        if layers < max(2, h // 96):
            break
        best = LlamaShape(h, inter, layers, heads, kv_heads, vocab)
    if best is None:
        raise ValueError(f"size {size_mb} MB is too small for a Llama family (>= 0.3 MB)")
    return best


@dataclass(frozen=True)
class ExpertSpec:
    """How one expert's delta is drawn."""

    name: str
    index: int
    lora_like: bool
    focus_layers: tuple[int, ...]


def _gen(*parts: object) -> torch.Generator:
    """A generator seeded with 63 bits of any key's hash: generation does not depend on order."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(h, "little") >> 1)


def _base_chunk(seed: int, name: str, shape: tuple[int, ...], r0: int, r1: int) -> torch.Tensor:
    cols = math.prod(shape[1:])
    g = _gen(seed, "base", name, r0)
    if len(shape) == 1:  # RMSNorm gains around 1
        return 1.0 + 0.05 * torch.randn(r1 - r0, generator=g)
    return BASE_STD * torch.randn((r1 - r0, cols), generator=g)


class _DeltaSource:
    """The delta of one (expert, tensor): scale and low-rank factors, drawn chunk by chunk."""

    def __init__(self, seed: int, spec: ExpertSpec, name: str, shape: tuple[int, ...]) -> None:
        self.seed, self.spec, self.name, self.shape = seed, spec, name, shape
        bits = name.split(".")
        layer = int(bits[2]) if len(bits) > 2 and bits[1] == "layers" else None
        gain = FOCUS_GAIN if layer in spec.focus_layers else 1.0
        ref = 0.05 if len(shape) == 1 else BASE_STD
        self.zero = spec.lora_like and not any(f".{t}." in name for t in LORA_TARGETS)
        noise = float(torch.randn(1, generator=_gen(seed, spec.index, name, "scale")))
        self.scale = ref * DELTA_REL * gain * math.exp(SCALE_SIGMA * noise)  # log-normal
        self.rank = LORA_RANK if spec.lora_like else RANK
        self.a: torch.Tensor | None = None
        self.b: torch.Tensor | None = None
        if len(shape) == 2 and not self.zero:
            g = _gen(seed, spec.index, name, "factors")
            self.a = torch.randn((shape[0], self.rank), generator=g)
            self.b = torch.randn((self.rank, shape[1]), generator=g) / math.sqrt(self.rank)

    def chunk(self, r0: int, r1: int) -> torch.Tensor:
        """The float32 delta of rows [r0, r1) (flattened rows for 1-D tensors)."""
        cols = math.prod(self.shape[1:])
        g = _gen(self.seed, self.spec.index, self.name, r0)
        if self.a is None or self.b is None:  # 1-D: dense noise only
            return self.scale * torch.randn(r1 - r0, generator=g)
        low = self.a[r0:r1] @ self.b
        if self.spec.lora_like:
            return low.mul_(self.scale)
        noise = torch.randn((r1 - r0, cols), generator=g)
        low.mul_(math.sqrt(LOWRANK_SHARE)).add_(noise, alpha=math.sqrt(1 - LOWRANK_SHARE))
        return low.mul_(self.scale)


class _ShardedWriter:
    """Writes one checkpoint's safetensors file(s) with headers known up front, tensor by tensor."""

    def __init__(self, out: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype: str,
                 shards: int) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.dtype = out, dtype
        groups = _split(tensors, DTYPE_SIZES[dtype], shards)
        names = (["model.safetensors"] if len(groups) == 1 else
                 [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
        self.files: dict[str, BinaryIO] = {}
        self.file_of: dict[str, str] = {}
        for group, fname in zip(groups, names, strict=True):
            header, _ = encode_header([(n, dtype, s) for n, s in group], {"format": "pt"})
            f = open(out / fname, "wb")  # noqa: SIM115 - closed in close()
            f.write(header)
            self.files[fname] = f
            self.file_of.update({n: fname for n, _ in group})
        if len(groups) > 1:
            total = sum(math.prod(s) for _, s in tensors) * DTYPE_SIZES[dtype]
            (out / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": self.file_of}, indent=2))

    def write(self, name: str, data: torch.Tensor | bytes) -> None:
        f = self.files[self.file_of[name]]
        if isinstance(data, bytes):
            f.write(data)
        else:
            f.write(data.to(torch_dtype(self.dtype)).contiguous().view(torch.uint8).numpy().data)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _split(tensors: list[tuple[str, tuple[int, ...]]], itemsize: int, shards: int
           ) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Contiguous groups of tensors of about equal bytes (HF's shard layout)."""
    if shards <= 1:
        return [tensors]
    total = sum(math.prod(s) for _, s in tensors) * itemsize
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    done = 0
    for n, s in tensors:
        if groups[-1] and done >= total * len(groups) / shards and len(groups) < shards:
            groups.append([])
        groups[-1].append((n, s))
        done += math.prod(s) * itemsize
    return groups


def expert_specs(experts: int, lora_experts: int, layers: int, seed: int) -> list[ExpertSpec]:
    """Names, kinds and focus layers; LoRA-like experts are spread evenly over the positions."""
    if not 0 <= lora_experts <= experts:
        raise ValueError(f"--lora-experts {lora_experts} must be between 0 and {experts}")
    lora = {round((j + 1) * experts / lora_experts) - 1 for j in range(lora_experts)}
    out = []
    for i in range(experts):
        perm = torch.randperm(layers, generator=_gen(seed, i, "focus"))
        focus = tuple(sorted(int(x) for x in perm[:min(FOCUS_LAYERS, layers)]))
        out.append(ExpertSpec(f"expert-{i:02d}", i, i in lora, focus))
    return out


def generate_family(out: str | os.PathLike[str], *, experts: int = 4, size_mb: float = 200.0,
                    dtype: str = "bf16", shards: int = 1, seed: int = 0,
                    lora_experts: int = 0, shape: LlamaShape | None = None) -> dict[str, Path]:
    """Write base/ and expert-NN/ checkpoints and family.json under `out`; name -> directory."""
    t0 = time.perf_counter()
    root = Path(out).absolute()
    dt = normalize_dtype(dtype)
    shape = shape or shape_for_size(size_mb, DTYPE_SIZES[dt])
    tensors = shape.tensors()
    specs = expert_specs(experts, lora_experts, shape.layers, seed)
    dirs = {"base": root / "base", **{s.name: root / s.name for s in specs}}
    writers = {n: _ShardedWriter(d, tensors, dt, shards) for n, d in dirs.items()}
    try:
        for name, shp in tensors:
            _write_tensor(writers, specs, seed, name, shp, dt)
    finally:
        for w in writers.values():
            w.close()
    config = json.dumps(shape.config(dt), indent=2)
    for d in dirs.values():
        (d / "config.json").write_text(config)
    nbytes = shape.numel * DTYPE_SIZES[dt]
    info = {"seed": seed, "dtype": dt, "shards": shards, "size_mb": size_mb,
            "checkpoint_bytes": nbytes, "shape": asdict(shape), "base": "base",
            "experts": [{"name": s.name, "lora_like": s.lora_like,
                         "focus_layers": list(s.focus_layers)} for s in specs],
            "seconds": round(time.perf_counter() - t0, 3)}
    (root / FAMILY_FILE).write_text(json.dumps(info, indent=2))
    return dirs


def _write_tensor(writers: dict[str, _ShardedWriter], specs: list[ExpertSpec], seed: int,
                  name: str, shape: tuple[int, ...], dtype: str) -> None:
    """Stream one tensor of the base and of every expert, a row chunk at a time."""
    rows = shape[0]
    step = max(1, CHUNK_ELEMS // max(1, math.prod(shape[1:])))
    deltas = [_DeltaSource(seed, s, name, shape) for s in specs]
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        base = _base_chunk(seed, name, shape, r0, r1)
        raw = base.to(torch_dtype(dtype))
        base_bytes = raw.contiguous().view(torch.uint8).numpy().tobytes()
        writers["base"].write(name, base_bytes)
        base32 = raw.float()  # experts are fine-tuned from the stored (rounded) base
        for src in deltas:
            if src.zero:
                writers[src.spec.name].write(name, base_bytes)
            else:
                writers[src.spec.name].write(name, base32 + src.chunk(r0, r1))


def read_family(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The family.json written by generate_family."""
    info: dict[str, Any] = json.loads((Path(root) / FAMILY_FILE).read_text())
    return info
