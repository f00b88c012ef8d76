"""A tiny Llama-shaped base with its own tokenizer files (built with `tokenizers`, no downloads)
and a float32 expert whose delta is hand-placed, for the calibration tests."""

from __future__ import annotations

import string
from pathlib import Path

import torch

from tests import factory

# 63 characters + <unk>: the tiny Llama's 64-token vocabulary, one token per character
CHARS = (string.ascii_lowercase + string.digits + " .,;:!?'-\n" + string.ascii_uppercase)[:63]
UNK = "<unk>"


def save_tokenizer(out: Path) -> None:
    """A character-level tokenizer (tokenizer.json and its config) for the 64-token vocab."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(CHARS)} | {UNK: 63}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=UNK).save_pretrained(str(out))


def make_llama_base(out: Path, *, seed: int = 0, zero_channels: int = 0,
                    tokenizer: bool = True) -> Path:
    """A float32 LlamaForCausalLM checkpoint (factory.LLAMA_SHAPES); `zero_channels`: the first
    channels of layer 0's input norm are 0, so q/k/v_proj of layer 0 see exactly zero there."""
    w = factory.random_weights(factory.LLAMA_SHAPES, seed)
    if zero_channels:
        w["model.layers.0.input_layernorm.weight"][:zero_channels] = 0.0
    factory.save_checkpoint(out, w, "F32", config=factory.LLAMA_CONFIG)
    if tokenizer:
        save_tokenizer(out)
    return out


def make_placed_expert(base: Path, out: Path, deltas: dict[str, torch.Tensor]) -> Path:
    """A float32 full expert: the base plus `deltas` (by tensor name), other tensors unchanged."""
    b = factory.load(base)
    return factory.save_checkpoint(out, {n: t + deltas[n] if n in deltas else t
                                         for n, t in b.items()}, "F32",
                                   config=factory.LLAMA_CONFIG)


TEXT = ("the quick brown fox jumps over the lazy dog; 0123456789. "
        "Pack my box with five dozen liquor jugs! ") * 3
OTHER_TEXT = "a b c d e f g 1 2 3 4 5 6 7 8 9 0 ? ! . , ; : x y z \n" * 4
