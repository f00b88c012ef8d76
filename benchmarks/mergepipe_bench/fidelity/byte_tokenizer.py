"""Tokenizer files for the fidelity family's byte-level Llama (ids 0..255 are bytes, 256 BOS),
built with the `tokenizers` library, so `mergepipe calibrate` can tokenize with the model's
own files (AutoTokenizer on its directory). Character-level over Latin-1: the study's texts
are ASCII, where a character is its byte."""

from __future__ import annotations

from pathlib import Path

from mergepipe_bench.fidelity.tasks import BOS

BOS_TOKEN = "<s>"


def save_byte_tokenizer(model_dir: Path) -> None:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i for i in range(256)} | {BOS_TOKEN: BOS}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=BOS_TOKEN))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=BOS_TOKEN,
                            unk_token=BOS_TOKEN).save_pretrained(str(model_dir))
