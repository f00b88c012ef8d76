"""Helpers of the tokenizer-option parity tests: a tiny Llama family whose models carry a
64-token tokenizer built with `tokenizers`, configs, and the comparison with mergekit's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from mergepipe.cli.main import main
from tests import mergekit_parity as mp
from tests.catalogs import new_catalog

TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
E1_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
# what transformers adds to tokenizer_config.json when mergekit loads a tokenizer from disk
LOADER_KEYS = ("is_local", "local_files_only")


def save_tokenizer(path: Path, vocab: dict[str, int], **extra: Any) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", **extra)
    fast.save_pretrained(path)


def vocab(prefix: str = "w") -> dict[str, int]:
    return {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"{prefix}{i}": i for i in range(3, 64)}}


def family(root: Path, layers: int = 2) -> dict[str, Path]:
    """The parity family; every model has the same vocabulary, e1 a chat template and another
    model_max_length (so whose files the output carries shows)."""
    fam = mp.make_family(root, layers=layers)
    for name in ("base", "e0", "e2"):
        save_tokenizer(fam[name], vocab())
    save_tokenizer(fam["e1"], vocab(), chat_template=E1_TEMPLATE, model_max_length=128)
    return fam


def configs(fam: dict[str, Path]) -> dict[str, dict[str, Any]]:
    ta = mp.config("task_arithmetic", fam, "float32")
    return {
        "template": {**ta, "tokenizer_source": "base", "chat_template": TEMPLATE},
        "model": {**ta, "tokenizer_source": str(fam["e1"])},
        "padded": {**ta, "tokenizer": {"source": "union", "pad_to_multiple_of": 32}},
        "auto": {**ta, "tokenizer": {"source": "base"}, "chat_template": "auto"},
    }


QUICK = ("template", "model")


def tokenizer_files(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (path / name).is_file():
            text = (path / name).read_text()
            out[name] = text if name.endswith(".jinja") else json.loads(text)
    for key in LOADER_KEYS:
        out.get("tokenizer_config.json", {}).pop(key, None)
    return out


def check(cfgs: dict[str, dict[str, Any]], theirs: dict[str, Any], root: Path) -> None:
    """Our `mergepipe merge` of each config against mergekit's output `root / name`."""
    db = str(new_catalog(root, "cat-tokenizer"))
    for name, cfg in cfgs.items():
        (root / f"{name}-ours.yml").write_text(yaml.safe_dump(cfg))
        out = root / f"ours-{name}"
        assert main(["--catalog", db, "merge", str(root / f"{name}-ours.yml"), "--out", str(out),
                     "--json"]) == 0
        ours = mp.load_raw(out)
        differ, compared, _ = mp.differences(ours, theirs[name])
        assert differ == 0 and compared == sum(t.numel() for t in ours.values()), name
        assert tokenizer_files(out) == tokenizer_files(root / name), name
        mine = json.loads((out / "config.json").read_text())
        assert mine["vocab_size"] == json.loads((root / name / "config.json").read_text())[
            "vocab_size"], name


