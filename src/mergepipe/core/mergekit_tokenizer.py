"""mergekit's tokenizer options (`tokenizer_source`, `tokenizer:`, `chat_template`), parsed and
checked; no file access (jobs.tokenizer reads the models' tokenizers and applies them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mergepipe.core.errors import InvalidRequest

BASE, UNION = "base", "union"
AUTO_TEMPLATE = "auto"
BUNDLED = ("alpaca", "chatml", "exaone", "llama3", "mistral")  # mergekit's named templates
_TOKENIZER_KEYS = {"source", "tokens", "pad_to_multiple_of"}
_TOKEN_KEYS = {"source", "force"}


@dataclass(frozen=True)
class TokenizerOptions:
    """What a config asks of the output's tokenizer."""

    source: str | None = None  # "base", "union" or a model as written; None: the base's files
    key: str = "tokenizer_source"  # the YAML key that gave `source`
    pad_to_multiple_of: int | None = None
    tokens: tuple[str, ...] = ()  # `tokenizer.tokens` names (each must already be in the vocab)
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
    tokens: tuple[str, ...] = ()
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


def _tokens(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest("tokenizer.tokens: must be a mapping of token -> {source, force}",
                             field="tokenizer.tokens")
    for name, spec in value.items():
        key = f"tokenizer.tokens.{name}"
        if spec is not None and (not isinstance(spec, dict) or set(map(str, spec)) - _TOKEN_KEYS):
            raise InvalidRequest(f"{key}: must be {{source: ..., force: ...}}", field=key)
        if isinstance(spec, dict) and spec.get("force"):
            raise InvalidRequest(f"{key}.force: replacing a token's embedding is not supported "
                                 "(MergePipe merges the embeddings as they are)",
                                 field=f"{key}.force")
    return tuple(str(n) for n in value)


def _template(value: object) -> str | None:
    """mergekit's checks of `chat_template`: "auto", or a Jinja template's text."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest("chat_template: must be a Jinja template or auto",
                             field="chat_template")
    if value == AUTO_TEMPLATE:
        return value
    if value in BUNDLED:
        raise InvalidRequest(f"chat_template: {value!r} names one of mergekit's bundled "
                             "templates, which MergePipe does not ship; give the template's text "
                             "(or auto: the most common template of the models)",
                             field="chat_template")
    if len(value) < 20 or "{" not in value:
        raise InvalidRequest(f"chat_template: {value!r} is not a chat template (mergekit refuses "
                             "it too: \"Invalid chat template\")", field="chat_template")
    return value
