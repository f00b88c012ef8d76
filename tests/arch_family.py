"""Tiny seeded families of other architectures than Llama, with the tensor names and shapes of
transformers' classes and mergekit 0.1.5's architecture files (mergekit/_data/architectures):

* qwen2: q/k/v biases (1-D tensors in the attention), untied lm_head;
* gpt_neox: fused query_key_value, LayerNorm weight + bias, biases on every linear,
  embed_in / embed_out, no `model.` prefix;
* phi3: fused qkv_proj and gate_up_proj;
* gemma2: four norms per layer and tied embeddings (no lm_head in the files).

Each family: a base and 3 full experts (e0 leaves one tensor untouched, e2 is sparse), as
tests/mergekit_parity.make_family builds the Llama one. Hidden 32, 2 layers, vocabulary 64.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests import factory
from tests import mergekit_parity as mp

H, V, LAYERS = 32, 64, 2
COMMON = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
          "vocab_size": V, "max_position_embeddings": 128, "torch_dtype": "bfloat16"}


def _layers(per_layer: dict[str, tuple[int, ...]], prefix: str) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{i}.{k}": v for i in range(LAYERS) for k, v in per_layer.items()}


def _qwen2() -> tuple[dict, dict]:
    per = {"input_layernorm.weight": (H,), "self_attn.q_proj.weight": (32, H),
           "self_attn.q_proj.bias": (32,), "self_attn.k_proj.weight": (16, H),
           "self_attn.k_proj.bias": (16,), "self_attn.v_proj.weight": (16, H),
           "self_attn.v_proj.bias": (16,), "self_attn.o_proj.weight": (H, 32),
           "post_attention_layernorm.weight": (H,), "mlp.gate_proj.weight": (48, H),
           "mlp.up_proj.weight": (48, H), "mlp.down_proj.weight": (H, 48)}
    shapes = {"model.embed_tokens.weight": (V, H), **_layers(per, "model.layers"),
              "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "intermediate_size": 48,
           "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "tie_word_embeddings": False}
    return shapes, cfg


# The buffers mergekit's gpt-neox.json requires in every layer (Pythia's files have them; a
# checkpoint saved by transformers 5 does not, and mergekit refuses it): the causal mask (BOOL in
# Pythia's files, float here), the masking value (0-d) and the rotary frequencies.
BUFFERS = {"attention.bias": (1, 1, 16, 16), "attention.masked_bias": (),
           "attention.rotary_emb.inv_freq": (2,)}


def buffer_value(name: str) -> torch.Tensor | None:
    if name.endswith("attention.bias"):
        return torch.tril(torch.ones(BUFFERS["attention.bias"]))
    if name.endswith("masked_bias"):
        return torch.tensor(-1e9)
    if name.endswith("inv_freq"):
        return torch.tensor([1.0, 0.01])
    return None


def _gpt_neox() -> tuple[dict, dict]:
    per = {"input_layernorm.weight": (H,), "input_layernorm.bias": (H,),
           "post_attention_layernorm.weight": (H,), "post_attention_layernorm.bias": (H,),
           "attention.query_key_value.weight": (3 * H, H),
           "attention.query_key_value.bias": (3 * H,),
           "attention.dense.weight": (H, H), "attention.dense.bias": (H,),
           "mlp.dense_h_to_4h.weight": (64, H), "mlp.dense_h_to_4h.bias": (64,),
           "mlp.dense_4h_to_h.weight": (H, 64), "mlp.dense_4h_to_h.bias": (H,),
           **BUFFERS}
    shapes = {"gpt_neox.embed_in.weight": (V, H), **_layers(per, "gpt_neox.layers"),
              "gpt_neox.final_layer_norm.weight": (H,), "gpt_neox.final_layer_norm.bias": (H,),
              "embed_out.weight": (V, H)}
    cfg = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
           "intermediate_size": 64, "rotary_pct": 0.5, "layer_norm_eps": 1e-5,
           "hidden_act": "gelu", "use_parallel_residual": True, "tie_word_embeddings": False}
    return shapes, cfg


def _phi3() -> tuple[dict, dict]:
    per = {"input_layernorm.weight": (H,), "self_attn.qkv_proj.weight": (32 + 2 * 16, H),
           "self_attn.o_proj.weight": (H, 32), "post_attention_layernorm.weight": (H,),
           "mlp.gate_up_proj.weight": (2 * 48, H), "mlp.down_proj.weight": (H, 48)}
    shapes = {"model.embed_tokens.weight": (V, H), **_layers(per, "model.layers"),
              "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "intermediate_size": 48,
           "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "hidden_act": "silu",
           "tie_word_embeddings": False}
    return shapes, cfg


def _gemma2() -> tuple[dict, dict]:
    per = {"input_layernorm.weight": (H,), "self_attn.q_proj.weight": (32, H),
           "self_attn.k_proj.weight": (16, H), "self_attn.v_proj.weight": (16, H),
           "self_attn.o_proj.weight": (H, 32), "post_attention_layernorm.weight": (H,),
           "pre_feedforward_layernorm.weight": (H,), "mlp.gate_proj.weight": (48, H),
           "mlp.up_proj.weight": (48, H), "mlp.down_proj.weight": (H, 48),
           "post_feedforward_layernorm.weight": (H,)}
    shapes = {"model.embed_tokens.weight": (V, H), **_layers(per, "model.layers"),
              "model.norm.weight": (H,)}
    cfg = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "intermediate_size": 48,
           "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
           "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}
    return shapes, cfg


ARCHS = {"qwen2": _qwen2, "gpt_neox": _gpt_neox, "phi3": _phi3, "gemma2": _gemma2}


def spec(arch: str) -> tuple[dict[str, tuple[int, ...]], dict[str, object]]:
    """(tensor shapes in file order, config.json) of `arch`."""
    shapes, cfg = ARCHS[arch]()
    return shapes, {**COMMON, **cfg}


def weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights: matrices near 0, norm weights near 1, biases near 0."""
    w = factory.random_weights(shapes, seed)
    return {n: b if (b := buffer_value(n)) is not None else t - 1.0 if n.endswith(".bias") else t
            for n, t in w.items()}


def make_family(root: Path, arch: str, dtype: str = "BF16") -> dict[str, Path]:
    """`arch`'s base and the experts of mergekit_parity.EXPERTS, each with its config.json."""
    shapes, cfg = spec(arch)
    base = factory.save_checkpoint(root / "base", weights(shapes, 0), dtype=dtype, config=cfg)
    untouched = next(n for n in shapes if "norm" in n and n.endswith("weight")
                     and "layers" not in n)
    buffers = tuple(n for n in shapes if buffer_value(n) is not None)  # fine-tuning leaves them
    out = {"base": base}
    for i, name in enumerate(mp.EXPERTS):
        out[name] = factory.make_expert(
            base, root / name, seed=100 + i, zero_tensors=buffers + ((untouched,) if i == 0 else ()),
            sparsity=0.3 if i == 2 else 0.0)
        (out[name] / "config.json").write_text(json.dumps(cfg))
    return out
