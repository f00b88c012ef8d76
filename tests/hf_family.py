"""Tiny random transformers families built locally (no download): Llama/Qwen2 bases, experts, LoRA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 96


def tokenizer() -> Any:
    """A tiny word-level tokenizer built in memory (what a real base ships as tokenizer files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")


def config(arch: str = "llama", *, tied: bool = False) -> Any:
    """A 2-layer config of `arch` (llama | qwen2) with a 96-token vocabulary."""
    from transformers import LlamaConfig, Qwen2Config
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=3)


def make_base(out: Path, *, arch: str = "llama", tied: bool = False, dtype: torch.dtype =
              torch.bfloat16, seed: int = 0, max_shard_size: str | None = None) -> Path:
    """save_pretrained of a random model, with tokenizer and generation config."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(arch, tied=tied), dtype=dtype)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kw)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, max_new_tokens=8,
                     do_sample=False).save_pretrained(out)
    tokenizer().save_pretrained(out)
    # A model card of its own, as Hub models have: the merge output must carry its own card.
    (out / "README.md").write_text("---\nlicense: apache-2.0\n---\n# The base model\n")
    return out


def make_expert(base: Path, out: Path, *, seed: int, scale: float = 0.02) -> Path:
    """The base with every weight perturbed by seeded noise (a fine-tune stand-in)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(base)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * scale).to(p.dtype))
    model.save_pretrained(out)
    return out


def make_family(root: Path, *, arch: str = "llama", tied: bool = False, n_experts: int = 3
                ) -> dict[str, Path]:
    """A base and `n_experts` perturbed experts under `root`."""
    base = make_base(root / "base", arch=arch, tied=tied)
    fam = {"base": base}
    for i in range(n_experts):
        fam[f"e{i}"] = make_expert(base, root / f"e{i}", seed=100 + i)
    return fam


def make_lora(base: Path, out: Path, *, seed: int, r: int = 4, alpha: int = 8,
              targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj"),
              use_rslora: bool = False) -> Path:
    """A PEFT LoRA adapter on `base` with random non-zero lora_A and lora_B, saved with peft."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(
        targets), use_rslora=use_rslora, lora_dropout=0.0, task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    peft_model.save_pretrained(str(out))
    return out


def state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved model directory, float32."""
    from safetensors.torch import load_file
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(str(f)).items()})
    return out
