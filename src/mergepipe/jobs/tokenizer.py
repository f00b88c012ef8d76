"""mergekit's tokenizer options against the models' files: the output's tokenizer files, its chat
template, and its vocabulary with each model's embedding row of every token (plan_tokenizer;
jobs.reindex moves the rows). A model at a URL (a Hub repository pinned at its ingested commit)
has its small files read whole through the storage layer's store."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import stat
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_tokenizer import (
    AUTO_TEMPLATE,
    BASE,
    MODEL_TOKEN,
    UNION,
    TokenizerOptions,
    TokenSpec,
)
from mergepipe.storage.locations import is_url, join
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import FILE

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


def model_file(model: str, name: str, cap: int = MAX_FILE_BYTES) -> bytes | None:
    """The file `name` of the checkpoint at `model` (a directory or a URL); None when it is
    missing, not a regular file or over `cap` bytes. Errors of a remote store (not found at
    the revision aside) propagate: a Hub that does not answer is not a missing file."""
    if not is_url(model):
        return read_file(Path(model) / name, cap)
    where = join(model, name)
    store = store_for(where)
    try:
        if store.kind(where) != FILE:
            return None
        return store.read_bytes(where, cap)
    except FileNotFoundError:
        return None
    except OSError as e:  # over the cap (EFBIG), as a local file over it
        if e.errno == errno.EFBIG:
            return None
        raise


def model_json(model: str, name: str) -> dict[str, object] | None:
    """A checkpoint's JSON object file (None: missing, unreadable or not an object)."""
    return _json(model_file(model, name))


def _json(data: bytes | None) -> dict[str, object] | None:
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True)
class VocabModel:
    """One input of the re-indexing: its checkpoint, and for each output token id the row of
    its embeddings holding that token (-1: it lacks the token)."""

    text: str  # the model as written in the config
    path: str
    rows: tuple[int, ...]


@dataclass(frozen=True)
class Reindex:
    """The embeddings moved to the output vocabulary (jobs.reindex runs it): `tokens` by
    output id, padded to `rows` rows; `models` in the order the merge method sums its inputs
    (the experts as listed, the base where it is listed or else last)."""

    tokens: tuple[str, ...]
    rows: int
    base: int  # index of the base in `models`
    models: tuple[VocabModel, ...]
    specs: tuple[TokenSpec, ...]  # tokenizer.tokens (model sources as written in the config)

    def record(self) -> dict[str, object]:
        """What the manifest records of it."""
        return {"vocabulary": len(self.tokens), "rows": self.rows,
                "models": [m.text for m in self.models],
                "tokens_sha256": hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()}


@dataclass(frozen=True)
class TokenizerPlan:
    """The output's tokenizer: files copied from `files_from` (None: the base's, as merged),
    `added` entries appended to its tokenizer.json's added_tokens, the chat template written
    (None: as copied), and the embeddings' re-indexing (None: they stay as merged)."""

    files_from: str | None
    chat_template: str | None
    added: tuple[Mapping[str, object], ...] = ()
    reindex: Reindex | None = None
    options: Mapping[str, object] | None = None  # the config's options, for the manifest

    def document(self) -> dict[str, Any]:
        """The plan as JSON, recorded with the merge's plan (a replay redoes it)."""
        return {**_plan_adapter().dump_python(self, mode="json"), "options": dict(self.options or {})}

    @staticmethod
    def from_document(doc: Mapping[str, Any]) -> TokenizerPlan:
        return _plan_adapter().validate_python(doc)


@functools.cache
def _plan_adapter() -> Any:
    # pydantic loads only when a tokenizer plan is recorded or read: ingestion and the
    # CLI's light commands import this module and stay without it (test_startup_imports).
    from pydantic import TypeAdapter
    return TypeAdapter(TokenizerPlan)


@dataclass(frozen=True)
class _Tok:
    """A tokenizer.json's token -> id (vocabulary and added tokens), the added tokens' entries,
    and the model's embedding rows (config.json vocab_size, else the vocabulary's size)."""

    vocab: dict[str, int]
    added: dict[str, dict[str, object]]
    size: int


def plan_tokenizer(opts: TokenizerOptions, base: str, paths: Mapping[str, str],
                   order: Sequence[str] = (), *, reindex: bool = False) -> TokenizerPlan:
    """`base`: the base's checkpoint directory; `paths`: each model as written -> its directory
    (the base included); `order`: the models as the merge method sums them (default: `paths`
    with the base last). mergekit's output vocabulary and each model's rows in it. Without
    `reindex` (a caller that cannot run jobs.reindex), options that would move the embeddings
    are refused, naming the option."""
    template = opts.chat_template
    if template == AUTO_TEMPLATE:
        template = _most_common_template([base, *paths.values()])
    if not opts.rebuilds:
        return TokenizerPlan(None, template)
    source = opts.source
    src = base if source in (BASE, UNION) else paths.get(str(source))
    if src is None:
        raise InvalidRequest(f"{opts.key}: {source!r} is not a local checkpoint", field=opts.key)
    base_text = next((t for t, p in paths.items() if p == base), "base_model")
    named = {**paths, base_text: base}
    toks = {t: _read(p, opts.key) for t, p in named.items()}
    base_tok = toks[base_text]
    if base_tok is None:
        raise InvalidRequest(f"{opts.key}: {base}/tokenizer.json: missing (the output's "
                             "vocabulary starts from the base's tokenizer)", field=opts.key)
    _unstripped(base_text, base_tok, opts.key)
    out_tok = base_tok if src == base else _need(_read(src, opts.key), src, opts.key)
    tokens, added = _output_vocab(opts, out_tok, base_tok,
                                  [k for t, k in toks.items() if k is not None and t != base_text])
    rows = len(tokens)
    if opts.pad_to_multiple_of and rows % opts.pad_to_multiple_of:
        rows += opts.pad_to_multiple_of - rows % opts.pad_to_multiple_of
    names = list(order) or [*(t for t in named if t != base_text), base_text]
    models = tuple(_rows(t, named[t], toks[t], base_tok, tokens, opts.key) for t in names)
    specs = tuple(_check_spec(s, toks, models, tokens) for s in opts.tokens)
    moved: Reindex | None = Reindex(tuple(tokens), rows, names.index(base_text), models, specs)
    if all(_identity(m, rows) for m in models) and not any(s.force for s in specs):
        moved = None  # every model already holds the output's tokens at their ids
    if moved is not None and reindex:
        _same_rows(opts.key, named, base_text)
    if moved is not None and not reindex:
        raise InvalidRequest(f"{opts.key}: {source}: the output vocabulary ({len(tokens)} "
                             f"tokens, {rows} rows) moves the models' embedding rows; "
                             "re-indexing the embeddings is supported by merges, not here",
                             field=opts.key)
    options = {"source": source, "pad_to_multiple_of": opts.pad_to_multiple_of,
               "tokens": [asdict(s) for s in opts.tokens]}
    return TokenizerPlan(src, template, tuple(added), moved, options)


def _same_rows(key: str, named: Mapping[str, str], base_text: str) -> None:
    """The catalog stores experts as deltas of the base's tensors, the embeddings of an expert
    that added tokens by the rows it shares with the base (catalog.ingest): a model may have
    more embedding rows than the base (config.json vocab_size), not fewer."""
    want = _vocab_size(named[base_text])
    for text, path in named.items():
        n = _vocab_size(path)
        if want is not None and n is not None and n < want:
            raise InvalidRequest(f"{key}: {text} has {n} embedding rows (config.json "
                                 f"vocab_size), fewer than the base's {want}; MergePipe stores "
                                 "experts as deltas of the base's tensors, so merging a model "
                                 "with fewer embedding rows than its base is not supported",
                                 field=key)


def _output_vocab(opts: TokenizerOptions, out_tok: _Tok, base: _Tok, others: list[_Tok]
                  ) -> tuple[list[str], list[dict[str, object]]]:
    """The output's tokens by id, and the added tokens' entries it appends to `out_tok`."""
    out = dict(out_tok.vocab)
    added: list[dict[str, object]] = []
    if opts.source == UNION:
        _union(out, added, base, others)
    for spec in opts.tokens:
        if spec.name not in out:
            _append(out, added, _plain(spec.name))
    return _by_id(out, opts.key), added


def _union(out: dict[str, int], added: list[dict[str, object]], base: _Tok,
           others: list[_Tok]) -> None:
    """mergekit's union: every model's regular tokens (below its vocab_size) missing from the
    base, then every model's added tokens (the first settings seen), appended as added tokens.
    mergekit walks each vocabulary in its hash map's order, which varies between runs; here by
    id, the base first, then the models as listed: the same tokens, each with the same rows."""
    plain, specials = _union_tokens([base, *others])
    for t in plain:
        if t not in specials and t not in base.vocab:
            _append(out, added, _plain(t))
    for t, entry in specials.items():
        settings = {k: v for k, v in entry.items() if k != "id"}
        if t not in out:
            _append(out, added, settings)
        elif t not in base.added:  # a regular token of the base: now an added token at its id
            added.append({"id": out[t], **settings})


def _union_tokens(toks: list[_Tok]) -> tuple[dict[str, None], dict[str, dict[str, object]]]:
    """The models' regular tokens, and their added tokens' first entries (below vocab_size)."""
    plain: dict[str, None] = {}
    specials: dict[str, dict[str, object]] = {}
    for tok in toks:
        for t, i in sorted(tok.vocab.items(), key=lambda kv: kv[1]):
            if i < tok.size and t not in tok.added:
                plain.setdefault(t)
        for t, entry in sorted(tok.added.items(), key=lambda kv: tok.vocab[kv[0]]):
            if tok.vocab[t] < tok.size:
                specials.setdefault(t, entry)
    return plain, specials


def _plain(token: str) -> dict[str, object]:
    """A token added by name (as transformers' add_tokens of a string records it)."""
    return {"content": token, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": True, "special": False}


def _append(out: dict[str, int], added: list[dict[str, object]], entry: dict[str, object]
            ) -> None:
    i = len(out)
    out[str(entry["content"])] = i
    added.append({"id": i, **entry})


def _by_id(vocab: Mapping[str, int], key: str) -> list[str]:
    tokens = sorted(vocab, key=lambda t: vocab[t])
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise InvalidRequest(f"{key}: the output tokenizer's ids are not 0..{len(tokens) - 1} "
                             "without gaps", field=key)
    return tokens


def _need(tok: _Tok | None, path: str, key: str) -> _Tok:
    if tok is None:
        raise InvalidRequest(f"{key}: {path}/tokenizer.json: missing or not JSON (a fast "
                             "tokenizer is needed)", field=key)
    return tok


def _unstripped(text: str, tok: _Tok, key: str) -> None:
    """mergekit strips the base's tokens at ids past its vocab_size (BPE only): refused here."""
    over = sorted((i, t) for t, i in tok.vocab.items() if i >= tok.size)
    if over:
        raise InvalidRequest(f"{key}: {text}: token {over[0][1]!r} has id {over[0][0]}, past the "
                             f"model's {tok.size} embedding rows (config.json vocab_size); a "
                             "base tokenizer with tokens beyond its embeddings is not supported",
                             field=key)


def _rows(text: str, path: str, tok: _Tok | None, base: _Tok, tokens: Sequence[str],
          key: str) -> VocabModel:
    """Each output token's row in the model (a model without a tokenizer has the base's)."""
    have = tok or _Tok(base.vocab, base.added, _vocab_size(path) or len(base.vocab))
    rows = []
    for t in tokens:
        i = have.vocab.get(t, -1)
        if i >= have.size:
            raise InvalidRequest(f"{key}: {text}: token {t!r} has id {i}, past the model's "
                                 f"{have.size} embedding rows (mergekit fails on it too)",
                                 field=key)
        rows.append(i)
    return VocabModel(text, path, tuple(rows))


def _identity(m: VocabModel, rows: int) -> bool:
    """Whether the model's embeddings already are the output's (its rows in order, as many)."""
    return (m.rows == tuple(range(len(m.rows))) and rows == len(m.rows)
            and _vocab_size(m.path) in (None, rows))


def _check_spec(spec: TokenSpec, toks: Mapping[str, _Tok | None],
                models: Sequence[VocabModel], tokens: Sequence[str]) -> TokenSpec:
    """A tokens: entry whose source is one mergekit can take (what it fails on is refused
    here, naming the entry): a model of the merge having the token; a model_token source's
    token as its row (token_id)."""
    where = f"tokenizer.tokens.{spec.name}"
    src = spec.source
    names = [m.text for m in models]
    if src.model is not None and src.model not in names:
        field = f"{where}.source.model" if src.kind == MODEL_TOKEN else f"{where}.source"
        raise InvalidRequest(f"{field}: {src.model!r} is not one of the config's models "
                             f"({', '.join(names)})", field=field)
    tid = tokens.index(spec.name)
    lacking = [m.text for m in models if m.rows[tid] < 0]
    if src.kind == "default" and (spec.force or lacking):
        raise InvalidRequest(f"{where}.source: missing; {(lacking or names)[0]} lacks the "
                             "token's row, so it needs a source (a model, {kind: zero} or "
                             "{kind: model_token, ...})", field=f"{where}.source")
    if src.kind == "model" and src.model in lacking:
        raise InvalidRequest(f"{where}.source: {src.model} has no token {spec.name!r}",
                             field=f"{where}.source")
    if src.kind == MODEL_TOKEN and src.token is not None:
        tok = toks.get(str(src.model))
        if tok is None or src.token not in tok.vocab:
            raise InvalidRequest(f"{where}.source.token: {src.model} has no token "
                                 f"{src.token!r}", field=f"{where}.source.token")
        spec = replace(spec, source=replace(src, token=None, token_id=tok.vocab[src.token]))
    return spec


def apply_tokenizer(plan: TokenizerPlan, out_dir: Path) -> list[str]:
    """Write the planned tokenizer files into `out_dir`; the names written."""
    written: list[str] = []
    if plan.files_from is not None:
        for name in TOKENIZER_FILES:
            (out_dir / name).unlink(missing_ok=True)
            data = model_file(plan.files_from, name)
            if data is not None:
                (out_dir / name).write_bytes(data)
                written.append(name)
    if plan.added:  # the tokens the vocabulary gained, in id order as tokenizers writes them
        doc = json.loads((out_dir / "tokenizer.json").read_text())
        doc["added_tokens"] = sorted([*doc.get("added_tokens", []), *map(dict, plan.added)],
                                     key=lambda e: int(e["id"]))
        (out_dir / "tokenizer.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
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


def _read(path: str, key: str) -> _Tok | None:
    """A checkpoint's tokenizer (None: it has no tokenizer.json nor tokenizer.model, and mergekit
    assumes the base's)."""
    raw = model_file(path, "tokenizer.json")
    doc = _json(raw)
    if doc is None:
        if raw is None and not _exists(path, "tokenizer.json") and not _exists(
                path, "tokenizer.model"):
            return None
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
    added: dict[str, dict[str, object]] = {}
    entries = doc.get("added_tokens")
    for t in entries if isinstance(entries, list) else []:
        if isinstance(t, dict) and isinstance(t.get("id"), int):
            out[str(t.get("content"))] = t["id"]
            added[str(t.get("content"))] = t
    return _Tok(out, added, _vocab_size(path) or len(out))


def _exists(model: str, name: str) -> bool:
    if not is_url(model):
        return (Path(model) / name).exists()
    where = join(model, name)
    try:
        return store_for(where).kind(where) is not None
    except FileNotFoundError:
        return False


def _vocab_size(path: str) -> int | None:
    n = (model_json(path, "config.json") or {}).get("vocab_size")
    return n if isinstance(n, int) else None


def _most_common_template(paths: list[str]) -> str | None:
    """chat_template: auto - the template most of the models carry (the first on a tie)."""
    found: list[str] = []
    for p in dict.fromkeys(paths):
        text = _template_of(p)
        if text:
            found.append(text.strip())
    return Counter(found).most_common(1)[0][0] if found else None


def _template_of(path: str) -> str | None:
    data = model_file(path, TEMPLATE_FILE)
    if data is not None:
        return data.decode("utf-8", "replace")
    t = (model_json(path, "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(t, list):  # named templates: the default one
        t = next((e.get("template") for e in t
                  if isinstance(e, dict) and e.get("name") == "default"), None)
    return t if isinstance(t, str) else None
