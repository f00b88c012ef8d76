"""Helpers of the tokenizer-option parity tests: a tiny Llama family whose models carry a
64-token tokenizer built with `tokenizers`, configs, and the comparison with mergekit's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

from mergepipe.cli.main import main
from tests import mergekit_parity as mp
from tests.catalogs import new_catalog

TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
E1_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
# what transformers adds to tokenizer_config.json when mergekit loads a tokenizer from disk
LOADER_KEYS = ("is_local", "local_files_only")


def save_tokenizer(path: Path, vocab: dict[str, int], specials: tuple[str, ...] = (),
                   **extra: Any) -> None:
    """A WordLevel tokenizer of `vocab`; `specials`: tokens of it made added special tokens."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
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




# -- vocabularies that differ: the embeddings re-indexed -----------------------------------------
def renamed_vocab() -> dict[str, int]:
    """vocab() with its last 23 tokens renamed: a union gains them."""
    return {t: i for t, i in vocab().items() if i < 41} | {f"x{i}": i for i in range(41, 64)}


def permuted_vocab() -> dict[str, int]:
    """vocab()'s tokens at other ids (w3..w63 reversed)."""
    return {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": 66 - i for i in range(3, 64)}}


def differing_family(root: Path, layers: int = 2) -> dict[str, Path]:
    """The parity family whose vocabularies differ: e0 and e1 renamed tokens (x41..x62 in both:
    their mean; x63 only in e0 and y63 only in e1: the donor's row), e2 the base's tokens at
    other ids (the base's tokens e0 and e1 lack: the base's row), its w10 an added special
    token (a union makes the base's w10 one too)."""
    fam = mp.make_family(root, layers=layers)
    save_tokenizer(fam["base"], vocab())
    save_tokenizer(fam["e0"], renamed_vocab())
    save_tokenizer(fam["e1"], {("y63" if t == "x63" else t): i for t, i in renamed_vocab().items()})
    save_tokenizer(fam["e2"], permuted_vocab(), specials=("w10",))
    return fam


RESIZED_QUICK = ("task_arithmetic-resized-union",)
ADDED = ("n64", "n65", "n66", "n67")  # the tokens resized_family's e1 was fine-tuned with
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def resized_family(root: Path, layers: int = 2) -> dict[str, Path]:
    """differing_family whose e1 was fine-tuned with 4 added tokens (ADDED, ids 64..67): its
    embed_tokens and lm_head have 68 rows (the extra rows seeded), config.json vocab_size 68."""
    from safetensors.torch import load_file, save_file

    fam = differing_family(root, layers=layers)
    e1 = fam["e1"]
    tensors = load_file(str(e1 / "model.safetensors"))
    gen = torch.Generator().manual_seed(64)
    for k in VOCAB_TENSORS:
        t = tensors[k]
        extra = torch.randn((len(ADDED), t.shape[1]), generator=gen) * 0.02
        tensors[k] = torch.cat([t, extra.to(t.dtype)]).contiguous()
    save_file(tensors, str(e1 / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((e1 / "config.json").read_text())
    (e1 / "config.json").write_text(json.dumps({**cfg, "vocab_size": 64 + len(ADDED)}))
    words = {("y63" if t == "x63" else t): i for t, i in renamed_vocab().items()}
    save_tokenizer(e1, {**words, **{t: 64 + i for i, t in enumerate(ADDED)}})
    return fam


def resized_configs(fam: dict[str, Path], methods: tuple[str, ...] = ("task_arithmetic",)
                    ) -> dict[str, dict[str, Any]]:
    """Configs over resized_family: a union (gaining e1's added tokens) and the base's
    vocabulary (dropping them)."""
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        cfg = _method(m, fam, "float32")
        out[f"{m}-resized-union"] = {**cfg, "tokenizer_source": "union"}
        out[f"{m}-resized-base"] = {**cfg, "tokenizer": {"source": "base"}}
    return out


# the quick variant: a padded union with tokens: of every kind and a built-in template
VOCAB_QUICK = ("task_arithmetic-pad",)


def vocab_configs(fam: dict[str, Path], methods: tuple[str, ...] = ("task_arithmetic",),
                  templates: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Configs over the differing family: a union; a union padded with `tokens:` of every
    source kind (a new token from another's row, a zero row, forced rows, a donor) and the
    chatml template; the base's vocabulary padded, in bfloat16; and another model's vocabulary
    with each of `templates`."""
    e1, e2 = str(fam["e1"]), str(fam["e2"])
    tokens = {"zz": {"source": {"kind": "model_token", "model": e1, "token": "x45"}},
              "x50": {"source": {"kind": "zero"}},
              "w5": {"source": {"kind": "model_token", "model": e2, "token_id": 9},
                     "force": True},
              "x44": {"source": e1}, "w7": {"source": e2, "force": True}}
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        cfg = _method(m, fam, "float32")
        out[f"{m}-union"] = {**cfg, "tokenizer_source": "union"}
        out[f"{m}-pad"] = {**cfg, "tokenizer": {"source": "union", "pad_to_multiple_of": 32,
                                                "tokens": tokens}, "chat_template": "chatml"}
        out[f"{m}-base-pad"] = {**cfg, "dtype": "bfloat16",
                                "tokenizer": {"source": "base", "pad_to_multiple_of": 48}}
    for t in templates:
        out[f"model-{t}"] = {**_method("linear", fam, None), "tokenizer_source": e1,
                             "chat_template": t}
    return out


def _method(method: str, fam: dict[str, Path], dtype: str | None) -> dict[str, Any]:
    """mp.config; linear lists the base first, with a weight (mergekit's linear wants one)."""
    entry = {"parameters": {"weight": 0.5}} if method == "linear" else None
    return mp.config(method, fam, dtype, base_entry=entry)


def _untied(cfg: dict[str, Any], root: Path) -> dict[str, torch.Tensor]:
    """TIES methods: the entries no expert has at its trim threshold (mergekit's argsort keeps
    an arbitrary subset of tied entries: compared elsewhere), of the tensors as merged: the
    vocabulary tensors as moved to the output's ids (by our plan; rows at our ids)."""
    from mergepipe.catalog.db import Catalog
    from mergepipe.jobs.config import load_config
    from mergepipe.jobs.reindex import _read_tensor, move_rows

    dtype = getattr(torch, cfg.get("dtype") or "float32")
    fam = {n: Path(m["model"]) for n, m in zip(mp.EXPERTS, cfg["models"][-3:], strict=True)}
    fam["base"] = Path(cfg["base_model"])
    keep = mp.untied(fam, dtype)
    cat = Catalog(new_catalog(root, "cat-untied"))
    try:
        plan = load_config(cat, yaml.safe_dump(cfg))[1].tokenizer
    finally:
        cat.close()
    assert plan is not None and plan.reindex is not None
    r = plan.reindex
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        moved = move_rows(r, [_read_tensor(m.path, k).to(dtype) for m in r.models])
        base = moved[r.base]
        keep[k] = torch.ones(base.shape, dtype=torch.bool)
        experts = [t for i, t in enumerate(moved) if i != r.base]
        for t, dens in zip(experts, mp.DENSITIES, strict=True):
            d = (t - base).abs().float().reshape(-1)
            n = max(1, int(dens * d.numel()))
            tau = torch.sort(d, descending=True).values[n - 1]
            if tau > 0 and int((d >= tau).sum()) > n:
                keep[k] &= ~(d == tau).reshape(base.shape)
    return keep


def ids(path: Path) -> dict[str, int]:
    """A written tokenizer's token -> id (vocabulary and added tokens)."""
    doc = json.loads((path / "tokenizer.json").read_text())
    return {**doc["model"]["vocab"], **{a["content"]: a["id"] for a in doc["added_tokens"]}}


def same_tokenizer(ours: Path, theirs: Path) -> None:
    """The same files; the added tokens the same entries (mergekit numbers a union's in the
    order of a hash map, which varies between its runs: compared without their ids)."""
    a, b = tokenizer_files(ours), tokenizer_files(theirs)
    added = [sorted(json.dumps({k: v for k, v in e.items() if k != "id"}, sort_keys=True)
                    for e in d["tokenizer.json"].pop("added_tokens")) for d in (a, b)]
    assert added[0] == added[1], ours.name
    assert a == b, ours.name


def check_vocab(cfgs: dict[str, dict[str, Any]], root: Path) -> None:
    """Our `mergepipe merge` of each config against mergekit's output `root / name`: the other
    tensors bit-equal; each vocabulary tensor's row of every token bit-equal (at each tool's id
    of the token); the padding rows (the mean of the rows, summed in each tool's row order)
    bit-equal when the ids are, else within an ulp (TIES: not compared then, mergekit's trim
    of them depends on its run's order); TIES methods leave out entries at a trim threshold
    tie; the same tokenizer files and vocab_size."""
    db = str(new_catalog(root, "cat-vocab"))
    for name, cfg in cfgs.items():
        (root / f"{name}-ours.yml").write_text(yaml.safe_dump(cfg))
        out = root / f"ours-{name}"
        assert main(["--catalog", db, "merge", str(root / f"{name}-ours.yml"), "--out", str(out),
                     "--json"]) == 0
        ours, theirs = mp.load_raw(out), mp.load_raw(root / name)
        keep = _untied(cfg, root) if cfg["merge_method"] in mp.DENSITY_METHODS else {}
        same_tokenizer(out, root / name)
        mine, ref = ids(out), ids(root / name)
        assert sorted(mine) == sorted(ref), name
        toks = sorted(ref, key=ref.__getitem__)
        a_ids = torch.tensor([mine[t] for t in toks])
        b_ids = torch.tensor([ref[t] for t in toks])
        assert sorted(ours) == sorted(theirs), name
        for k, b in theirs.items():
            a = ours[k]
            assert (a.dtype, a.shape) == (b.dtype, b.shape), (name, k)
            m = keep.get(k, torch.ones(a.shape, dtype=torch.bool))
            if not k.endswith(("embed_tokens.weight", "lm_head.weight")):
                assert torch.equal(a[m], b[m]), (name, k)
                continue
            assert torch.equal(a[a_ids][m[a_ids]], b[b_ids][m[a_ids]]), (name, k)
            pad_a, pad_b, pad_m = a[len(toks):], b[len(toks):], m[len(toks):]
            if torch.equal(a_ids, b_ids):
                assert torch.equal(pad_a[pad_m], pad_b[pad_m]), (name, k)
            elif not keep:  # TIES over a mean an ulp apart trims otherwise: not compared
                ulp = torch.finfo(b.dtype).eps * pad_b.float().abs()
                assert bool(((pad_a.float() - pad_b.float()).abs() <= ulp).all()), (name, k)
        config = [json.loads((p / "config.json").read_text())["vocab_size"]
                  for p in (out, root / name)]
        assert config[0] == config[1] == theirs["model.embed_tokens.weight"].shape[0], name
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["tokenizer"]["rows"] == config[0], name
