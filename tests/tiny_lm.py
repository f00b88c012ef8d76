"""A tiny real causal LM family for the evaluation tests: a Llama-shaped model with seeded
random weights (safetensors + config.json, as a Hugging Face directory holds them), experts
that perturb it, and a word-level tokenizer built with the tokenizers library. No downloads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park", "with",
         "red", "blue", "ball", "under", "tree", "big", "small", "bird", "sang", "song", "at",
         "night", "day", "sun", "moon", "in", "all"]
TEXT = ("the cat sat on a mat and the dog ran to the park with a red ball . the big bird "
        "sang a song at night under the moon , and the small cat sat in the sun all day .")
VOCAB = ["[UNK]", "[BOS]", ".", ","] + WORDS


def llama_config() -> object:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=None, pad_token_id=None)


def save_tokenizer(out: Path) -> None:
    """tokenizer.json (word level, whitespace split, [BOS] first) and tokenizer_config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A",
                                                       special_tokens=[("[BOS]", 1)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]",
        "unk_token": "[UNK]"}))


def make_lm(out: Path, *, seed: int = 0, tokenizer: bool = True) -> Path:
    """A tiny Llama with seeded random weights (F32) in `out`: model.safetensors, config.json
    and, with `tokenizer`, its tokenizer files."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config())  # type: ignore[arg-type]
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    g = torch.Generator().manual_seed(seed)
    save_file({k: (torch.randn(v.shape, generator=g) * 0.3).contiguous()
               for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    if tokenizer:
        save_tokenizer(out)
    return out


def make_lm_expert(base: Path, out: Path, *, seed: int, scale: float = 0.05,
                   tokenizer: bool = True) -> Path:
    """The base's weights plus seeded noise of `scale`, with the base's config."""
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(str(base / "model.safetensors"))
    save_file({k: (v + scale * torch.randn(v.shape, generator=g)).contiguous()
               for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text((base / "config.json").read_text())
    if tokenizer:
        save_tokenizer(out)
    return out
