"""mergekit's tokenizer options (`tokenizer_source`, `tokenizer:`, `chat_template`), parsed and
checked; no file access but a built-in template's text (jobs.tokenizer reads the models'
tokenizers and applies them)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mergepipe.core.errors import InvalidRequest

BASE, UNION = "base", "union"
AUTO_TEMPLATE = "auto"
BUNDLED = ("alpaca", "chatml", "exaone", "llama3", "mistral")  # mergekit's named templates
_TOKENIZER_KEYS = {"source", "tokens", "pad_to_multiple_of"}
_TOKEN_KEYS = {"source", "force"}
ZERO, MODEL_TOKEN = "zero", "model_token"  # the `kind`s of a token's embedding source
# Tensors indexed by token (their first axis), by the last parts of their names.
VOCAB_TENSORS = ("embed_tokens.weight", "lm_head.weight", "wte.weight", "embed_in.weight",
                 "embed_out.weight", "word_embeddings.weight", "tok_embeddings.weight")


def is_vocab_tensor(name: str) -> bool:
    """Whether the tensor's first axis is indexed by token (embeddings, output head)."""
    return any(name == s or name.endswith("." + s) for s in VOCAB_TENSORS)


@dataclass(frozen=True)
class TokenSource:
    """Where `tokenizer.tokens.NAME` takes its embedding from. kind: "default" (no source: the
    models' own rows), "model" (that model's row of the token), "zero", or "model_token"
    (`model`'s row of `token` or of row `token_id`)."""

    kind: str = "default"
    model: str | None = None  # a model as written in the config
    token: str | None = None
    token_id: int | None = None


@dataclass(frozen=True)
class TokenSpec:
    """One `tokenizer.tokens` entry: the token (added to the vocabulary when new), its source,
    and `force` (every model's row replaced by the source's, even where the model has it)."""

    name: str
    source: TokenSource = TokenSource()
    force: bool = False


@dataclass(frozen=True)
class TokenizerOptions:
    """What a config asks of the output's tokenizer."""

    source: str | None = None  # "base", "union" or a model as written; None: the base's files
    key: str = "tokenizer_source"  # the YAML key that gave `source`
    pad_to_multiple_of: int | None = None
    tokens: tuple[TokenSpec, ...] = ()  # `tokenizer.tokens`, in the config's order
    chat_template: str | None = None  # a template's text, or "auto"

    @property
    def rebuilds(self) -> bool:
        """Whether mergekit builds an output tokenizer (and may re-index the embeddings)."""
        return self.source is not None


def parse_tokenizer(doc: dict[Any, Any]) -> TokenizerOptions | None:
    """The tokenizer options of a config (None: none given); InvalidRequest naming the key."""
    source, table, template = (doc.get("tokenizer_source"), doc.get("tokenizer"),
                               doc.get("chat_template"))
    if source is None and table is None and template is None:
        return None
    if source is not None and table is not None:
        raise InvalidRequest("tokenizer: give tokenizer_source or tokenizer:, not both (mergekit "
                             "refuses both too)", field="tokenizer")
    key, pad = "tokenizer_source", None
    tokens: tuple[TokenSpec, ...] = ()
    if table is not None:
        if not isinstance(table, dict):
            raise InvalidRequest("tokenizer: must be a mapping with source, tokens and "
                                 "pad_to_multiple_of", field="tokenizer")
        extra = sorted(set(map(str, table)) - _TOKENIZER_KEYS)
        if extra:
            raise InvalidRequest(f"tokenizer.{extra[0]}: unknown key; tokenizer: has "
                                 f"{', '.join(sorted(_TOKENIZER_KEYS))}", field=f"tokenizer.{extra[0]}")
        key, source = "tokenizer.source", table.get("source", UNION)  # mergekit's default
        pad = _pad(table.get("pad_to_multiple_of"))
        tokens = _tokens(table.get("tokens"))
    return TokenizerOptions(_source(source, key), key, pad, tokens, _template(template))


def _source(value: object, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{key}: must be base, union or a model (a local path or a "
                             f"registered model), got {value!r}", field=key)
    return value.strip()


def _pad(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"tokenizer.pad_to_multiple_of: must be a positive integer, got "
                             f"{value!r}", field="tokenizer.pad_to_multiple_of")
    return value


def _tokens(value: object) -> tuple[TokenSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest("tokenizer.tokens: must be a mapping of token -> {source, force}",
                             field="tokenizer.tokens")
    out = []
    for name, spec in value.items():
        key = f"tokenizer.tokens.{name}"
        if spec is None:
            spec = {}
        if not isinstance(spec, dict) or set(map(str, spec)) - _TOKEN_KEYS:
            raise InvalidRequest(f"{key}: must be {{source: ..., force: ...}}", field=key)
        force = spec.get("force", False)
        if not isinstance(force, bool):
            raise InvalidRequest(f"{key}.force: must be true or false, got {force!r}",
                                 field=f"{key}.force")
        out.append(TokenSpec(str(name), _token_source(spec.get("source"), f"{key}.source"),
                             force))
    return tuple(out)


def _token_source(value: object, key: str) -> TokenSource:
    """A token's `source`: nothing, a model, {kind: zero} or {kind: model_token, model, token
    | token_id} (mergekit's three shapes)."""
    if value is None:
        return TokenSource()
    if isinstance(value, str) and value.strip():
        return TokenSource("model", value.strip())
    doc = value if isinstance(value, dict) else {}
    kind, keys = doc.get("kind"), set(map(str, doc))
    if kind == ZERO and keys == {"kind"}:
        return TokenSource(ZERO)
    if kind == MODEL_TOKEN and keys <= {"kind", "model", "token", "token_id"}:
        model, token, token_id = doc.get("model"), doc.get("token"), doc.get("token_id")
        if not isinstance(model, str) or not model.strip():
            raise InvalidRequest(f"{key}.model: must name a model of the config", field=f"{key}.model")
        if (token is None) == (token_id is None):
            raise InvalidRequest(f"{key}: give one of token and token_id", field=key)
        if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int)
                                     or token_id < 0):
            raise InvalidRequest(f"{key}.token_id: must be a row number >= 0, got {token_id!r}",
                                 field=f"{key}.token_id")
        if token is not None and not isinstance(token, str):
            raise InvalidRequest(f"{key}.token: must be a token, got {token!r}",
                                 field=f"{key}.token")
        return TokenSource(MODEL_TOKEN, model.strip(), token, token_id)
    raise InvalidRequest(f"{key}: must be a model, {{kind: zero}} or {{kind: model_token, model: "
                         f"..., token: ...}}, got {value!r}", field=key)


def bundled_template(name: str) -> str:
    """The text of mergekit's built-in chat template `name` (one of BUNDLED), read from the
    installed mergekit's data files (not imported; its templates are not ours to ship)."""
    try:
        spec = importlib.util.find_spec("mergekit")
    except (ImportError, ValueError):
        spec = None
    folder = None if spec is None or spec.origin is None else Path(spec.origin).parent
    path = None if folder is None else folder / "_data" / "chat_templates" / f"{name}.jinja"
    if path is None or not path.is_file():
        raise InvalidRequest(f"chat_template: {name!r} names one of mergekit's built-in templates, "
                             "read from an installed mergekit (pip install 'mergekit==0.1.5'), "
                             "which is not installed here; give the template's text instead",
                             field="chat_template")
    return path.read_text(encoding="utf-8")


def _template(value: object) -> str | None:
    """mergekit's checks of `chat_template`: "auto", or a Jinja template's text."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest("chat_template: must be a Jinja template or auto",
                             field="chat_template")
    if value == AUTO_TEMPLATE:
        return value
    if value in BUNDLED:  # mergekit's built-in templates, by name
        return bundled_template(value)
    if len(value) < 20 or "{" not in value:
        raise InvalidRequest(f"chat_template: {value!r} is not a chat template (mergekit refuses "
                             "it too: \"Invalid chat template\")", field="chat_template")
    return value
