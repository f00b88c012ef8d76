"""mergekit's tokenizer options against the models' files: which tokenizer the output carries and
its chat template. mergekit re-indexes the embeddings to the output vocabulary; MergePipe runs the
options that leave them as they are (every model holds the output's tokens at the same ids, and
the padded vocabulary has as many rows as the embeddings) and refuses the others, naming the
option. The files are written beside the merged weights (local outputs)."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_tokenizer import AUTO_TEMPLATE, BASE, UNION, TokenizerOptions
from mergepipe.storage.locations import is_url

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "chat_template.jinja", "chat_template.json")
TEMPLATE_FILE = "chat_template.jinja"
MAX_FILE_BYTES = 128 << 20  # a 256k-token tokenizer.json is about 35 MB


def read_file(path: Path, cap: int = MAX_FILE_BYTES) -> bytes | None:
    """A small regular file's bytes; None when it is missing, not a regular file (a FIFO
    planted as tokenizer.json must not hang the read) or over `cap` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(cap + 1)[:cap]
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, object] | None:
    """A JSON object file (None: missing, unreadable or not an object)."""
    data = read_file(path)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class TokenizerPlan:
    """The output's tokenizer: files copied from `files_from` (None: the base's, as merged) and
    the chat template written (None: as copied)."""

    files_from: str | None
    chat_template: str | None


def plan_tokenizer(opts: TokenizerOptions, base: str, paths: Mapping[str, str]
                   ) -> TokenizerPlan:
    """`base`: the base's checkpoint directory; `paths`: each model as written -> its directory
    (the base included). Refuses what would re-index the embeddings, naming the option."""
    template = opts.chat_template
    if template == AUTO_TEMPLATE:
        template = _most_common_template([base, *paths.values()])
    if not opts.rebuilds:
        return TokenizerPlan(None, template)
    source = opts.source
    src = base if source in (BASE, UNION) else paths.get(str(source))
    if src is None:
        raise InvalidRequest(f"{opts.key}: {source!r} is not a local checkpoint", field=opts.key)
    out = _vocab(src, opts.key)
    for tok in opts.tokens:
        if tok not in out:
            raise InvalidRequest(f"tokenizer.tokens.{tok}: adding a token to the vocabulary (and "
                                 "a row to the embeddings) is not supported", field=
                                 f"tokenizer.tokens.{tok}")
    rows = len(out)
    if opts.pad_to_multiple_of and rows % opts.pad_to_multiple_of:
        rows += opts.pad_to_multiple_of - rows % opts.pad_to_multiple_of
    for model, path in {"base_model": base, **paths}.items():
        _same_ids(opts, model, path, out, rows)
    return TokenizerPlan(src, template)


def apply_tokenizer(plan: TokenizerPlan, out_dir: Path) -> list[str]:
    """Write the planned tokenizer files into `out_dir`; the names written."""
    written: list[str] = []
    if plan.files_from is not None:
        for name in TOKENIZER_FILES:
            (out_dir / name).unlink(missing_ok=True)
            data = read_file(Path(plan.files_from) / name)
            if data is not None:
                (out_dir / name).write_bytes(data)
                written.append(name)
    if plan.chat_template is not None and any(
            (out_dir / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        # transformers (5.x) saves a tokenizer's template as chat_template.jinja
        (out_dir / "chat_template.json").unlink(missing_ok=True)
        config = out_dir / "tokenizer_config.json"
        if config.is_file():
            doc = json.loads(config.read_text())
            if doc.pop("chat_template", None) is not None:
                config.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        (out_dir / TEMPLATE_FILE).write_text(plan.chat_template)
        written.append(TEMPLATE_FILE)
    return sorted(set(written))


def _same_ids(opts: TokenizerOptions, model: str, path: str, out: dict[str, int],
              rows: int) -> None:
    """mergekit moves each model's embedding rows to the output's token ids: a no-op only when
    the model has every output token at its id and the output has its number of rows."""
    key = opts.key
    if rows != len(out):
        raise InvalidRequest(f"tokenizer.pad_to_multiple_of: {opts.pad_to_multiple_of} pads the "
                             f"{len(out)}-token vocabulary to {rows} rows; new embedding rows are "
                             "not supported", field="tokenizer.pad_to_multiple_of")
    size = _vocab_size(path)
    if size is not None and size != rows:
        raise InvalidRequest(f"{key}: {opts.source}: the output vocabulary has {rows} tokens, "
                             f"but {model} has {size} embedding rows (config.json vocab_size); "
                             "resizing the embeddings is not supported", field=key)
    if not (Path(path) / "tokenizer.json").is_file() and not (
            Path(path) / "tokenizer.model").is_file():
        return  # no tokenizer: mergekit assumes the base's
    have = _vocab(path, key)
    for tok, i in out.items():
        if have.get(tok) != i:
            raise InvalidRequest(
                f"{key}: {opts.source}: the vocabularies differ ({model} has token {tok!r} at "
                f"{have.get(tok)}, the output at {i}); re-indexing the embeddings to another "
                "vocabulary is not supported", field=key)


def _vocab(path: str, key: str) -> dict[str, int]:
    """A tokenizer's token -> id (its model's vocabulary and its added tokens)."""
    if is_url(path):
        raise InvalidRequest(f"{key}: {path}: tokenizer options read local checkpoints",
                             field=key)
    doc = read_json(Path(path) / "tokenizer.json")
    if doc is None:
        raise InvalidRequest(f"{key}: {path}/tokenizer.json: missing or not JSON (a fast "
                             "tokenizer is needed)", field=key)
    model = doc.get("model")
    model = model if isinstance(model, dict) else {}
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        out = {str(p[0] if isinstance(p, list) and p else p): i for i, p in enumerate(vocab)}
    elif isinstance(vocab, dict):
        out = {str(k): v for k, v in vocab.items() if isinstance(v, int)}
    else:
        raise InvalidRequest(f"{key}: {path}/tokenizer.json has no vocabulary", field=key)
    added = doc.get("added_tokens")
    for t in added if isinstance(added, list) else []:
        if isinstance(t, dict) and isinstance(t.get("id"), int):
            out[str(t.get("content"))] = t["id"]
    return out


def _vocab_size(path: str) -> int | None:
    n = (read_json(Path(path) / "config.json") or {}).get("vocab_size")
    return n if isinstance(n, int) else None


def _most_common_template(paths: list[str]) -> str | None:
    """chat_template: auto - the template most of the models carry (the first on a tie)."""
    found: list[str] = []
    for p in dict.fromkeys(paths):
        text = _template_of(Path(p))
        if text:
            found.append(text.strip())
    return Counter(found).most_common(1)[0][0] if found else None


def _template_of(path: Path) -> str | None:
    data = read_file(path / TEMPLATE_FILE)
    if data is not None:
        return data.decode("utf-8", "replace")
    t = (read_json(path / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(t, list):  # named templates: the default one
        t = next((e.get("template") for e in t
                  if isinstance(e, dict) and e.get("name") == "default"), None)
    return t if isinstance(t, str) else None
