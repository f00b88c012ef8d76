"""Seeded factories of tiny real checkpoints: bases, full experts, delta checkpoints, LoRA adapters."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

# A picollama-like layout: embeddings, two layers of attention and MLP, norms, lm_head.
TINY_SHAPES: dict[str, tuple[int, ...]] = {
    "model.embed_tokens.weight": (64, 32),
    "model.layers.0.input_layernorm.weight": (32,),
    "model.layers.0.self_attn.q_proj.weight": (32, 32),
    "model.layers.0.self_attn.k_proj.weight": (16, 32),
    "model.layers.0.self_attn.v_proj.weight": (16, 32),
    "model.layers.0.self_attn.o_proj.weight": (32, 32),
    "model.layers.0.mlp.gate_proj.weight": (48, 32),
    "model.layers.0.mlp.up_proj.weight": (48, 32),
    "model.layers.0.mlp.down_proj.weight": (32, 48),
    "model.layers.1.input_layernorm.weight": (32,),
    "model.layers.1.self_attn.q_proj.weight": (32, 32),
    "model.layers.1.self_attn.k_proj.weight": (16, 32),
    "model.layers.1.self_attn.v_proj.weight": (16, 32),
    "model.layers.1.self_attn.o_proj.weight": (32, 32),
    "model.layers.1.mlp.gate_proj.weight": (48, 32),
    "model.layers.1.mlp.up_proj.weight": (48, 32),
    "model.layers.1.mlp.down_proj.weight": (32, 48),
    "model.norm.weight": (32,),
    "lm_head.weight": (64, 32),
}
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
          "torch_dtype": "bfloat16"}

# TINY_SHAPES completed into a real LlamaForCausalLM (post-attention norms) with a config that
# transformers and mergekit understand: 4 heads of 8, 2 KV heads (k/v_proj 16 rows), MLP 48.
LLAMA_SHAPES: dict[str, tuple[int, ...]] = {
    **TINY_SHAPES,
    **{f"model.layers.{i}.post_attention_layernorm.weight": (32,) for i in range(2)},
}
LLAMA_CONFIG = {**CONFIG, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2,
                "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
                "hidden_act": "silu", "tie_word_embeddings": False}


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int, scale: float = 0.05
                   ) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * scale + (1.0 if len(s) == 1 else 0.0)
            for n, s in shapes.items()}


def save_checkpoint(out: Path, tensors: dict[str, torch.Tensor], dtype: str = "BF16",
                    shards: int = 1, config: dict[str, object] | None = None) -> Path:
    """Write an HF-style directory: model.safetensors, or N shards plus the index."""
    out.mkdir(parents=True, exist_ok=True)
    cast = {n: t.to(TORCH[dtype]).contiguous() for n, t in tensors.items()}
    if shards <= 1:
        save_file(cast, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = list(cast)
        weight_map = {}
        for i in range(shards):
            part = names[i::shards]
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: cast[n] for n in part}, str(out / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        total = sum(t.numel() * t.element_size() for t in cast.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps({**CONFIG, **(config or {})}))
    return out


def make_base(out: Path, *, seed: int = 0, dtype: str = "BF16", shards: int = 1,
              shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    return save_checkpoint(out, random_weights(shapes or TINY_SHAPES, seed), dtype, shards)


def load(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (test-side reference reader, float32)."""
    from safetensors.torch import load_file
    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else [Path(path)]
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update({n: t.float() for n, t in load_file(str(f)).items()})
    return out


def make_expert(base: Path, out: Path, *, seed: int, scale: float = 0.01, dtype: str | None = None,
                shards: int = 1, zero_tensors: tuple[str, ...] = (),
                sparsity: float = 0.0) -> Path:
    """A full fine-tuned expert: base + a seeded delta (some tensors may keep a zero delta)."""
    b = load(base)
    g = torch.Generator().manual_seed(seed)
    out_t = {}
    for n, t in b.items():
        d = torch.randn(t.shape, generator=g) * scale * (1 + torch.rand(1, generator=g).item())
        if sparsity:
            d = d * (torch.rand(t.shape, generator=g) >= sparsity)
        out_t[n] = t if n in zero_tensors else t + d
    src_dtype = dtype or _dtype_of(base)
    return save_checkpoint(out, out_t, src_dtype, shards)


def make_delta(base: Path, out: Path, *, seed: int, scale: float = 0.01, dtype: str = "F32") -> Path:
    """An explicit delta checkpoint: tensors are the deltas themselves."""
    b = load(base)
    g = torch.Generator().manual_seed(seed)
    return save_checkpoint(out, {n: torch.randn(t.shape, generator=g) * scale for n, t in b.items()},
                           dtype)


def make_lora(base: Path, out: Path, *, seed: int, r: int = 4, alpha: float = 8.0,
              targets: tuple[str, ...] = ("q_proj", "v_proj"), use_rslora: bool = False,
              dtype: str = "F32", scale: float = 0.05,
              rank_pattern: dict[str, int] | None = None,
              alpha_pattern: dict[str, float] | None = None,
              config: dict[str, object] | None = None) -> Path:
    """A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).

    rank_pattern / alpha_pattern follow PEFT: a key matches a module name that ends with it
    (regex); `config` overrides entries of adapter_config.json.
    """
    b = load(base)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for n, t in b.items():
        if t.ndim != 2 or not any(f".{m}." in n for m in targets):
            continue
        stem = n.removesuffix(".weight")
        rank = _pattern_value(rank_pattern, stem, r)
        tensors[f"base_model.model.{stem}.lora_A.weight"] = torch.randn(rank, t.shape[1], generator=g) * scale
        tensors[f"base_model.model.{stem}.lora_B.weight"] = torch.randn(t.shape[0], rank, generator=g) * scale
    out.mkdir(parents=True, exist_ok=True)
    save_file({n: t.to(TORCH[dtype]) for n, t in tensors.items()},
              str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(targets),
        "use_rslora": use_rslora, "fan_in_fan_out": False, "bias": "none",
        "rank_pattern": rank_pattern or {}, "alpha_pattern": alpha_pattern or {},
        "base_model_name_or_path": str(base), "task_type": "CAUSAL_LM", **(config or {})}))
    return out


def _pattern_value(pattern: dict[str, int] | None, module: str, default: int) -> int:
    import re
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _dtype_of(path: Path) -> str:
    from mergepipe.storage.checkpoint import open_checkpoint
    return open_checkpoint(path).tensors[0].dtype
