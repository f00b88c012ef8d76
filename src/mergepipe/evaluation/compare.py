"""Teacher-forced comparison of two registered models on a text: the mean KL(A || B) per token and
each model's perplexity, in float64 (docs/deviation.md#compare-two-models)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.evaluation.models import load_lm, load_tokenizer, local_model

DEFAULT_TOKENS = 2048


@dataclass(frozen=True)
class Comparison:
    """What `compare` measured."""

    model_a: str
    model_b: str
    tokenizer: str        # the model whose tokenizer split the text
    tokens: int           # tokens read (the text's first, at most the limit asked)
    positions: int        # next-token predictions compared
    windows: int          # windows of at most `context` tokens, each read from its start
    context: int
    kl: float             # mean KL(A || B) in nats per token
    perplexity_a: float
    perplexity_b: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(cat: Catalog, model_a: str, model_b: str, text: str, *,
            tokens: int = DEFAULT_TOKENS, tokenizer: str | None = None) -> Comparison:
    """KL(A || B) and both perplexities on the first `tokens` tokens of `text`, tokenized by
    the tokenizer of `tokenizer` (a registered model), else A's, else B's."""
    t0 = time.perf_counter()
    if tokens < 2:
        raise InvalidRequest(f"tokens {tokens}: at least 2 (one next token to predict)",
                             field="tokens")
    a = local_model(cat, model_a, "model_a")
    b = local_model(cat, model_b, "model_b")
    if tokenizer is not None:
        tok_model = local_model(cat, tokenizer, "tokenizer")
    elif a.has_tokenizer or not b.has_tokenizer:
        tok_model = a
    else:
        tok_model = b
    if tokenizer is None and not (a.has_tokenizer or b.has_tokenizer):
        raise InvalidRequest(f"neither model {model_a!r} nor {model_b!r} has tokenizer files; "
                             "name a model whose tokenizer to use (tokenizer)",
                             field="tokenizer")
    tok = load_tokenizer(tok_model, "tokenizer")
    ids = list(tok(text, add_special_tokens=True)["input_ids"])[:tokens]
    if len(ids) < 2:
        raise InvalidRequest(f"the text is {len(ids)} token(s) long under model "
                             f"{tok_model.name!r}'s tokenizer: at least 2 are needed",
                             field="text")
    lm_a = load_lm(a, "model_a")
    lm_b = lm_a if b.directory == a.directory and b.weights == a.weights else load_lm(b, "model_b")
    context = min(_context(lm_a), _context(lm_b), len(ids))
    for lm, m, f in ((lm_a, a, "model_a"), (lm_b, b, "model_b")):
        vocab = int(lm.get_input_embeddings().num_embeddings)
        if max(ids) >= vocab:
            raise InvalidRequest(f"model {m.name!r} has {vocab} token embeddings but "
                                 f"{tok_model.name!r}'s tokenizer gives token id {max(ids)}: "
                                 "the two models do not share a vocabulary", field=f)
    kl, nll_a, nll_b, n, windows = _measure(lm_a, lm_b, ids, context, a.name, b.name)
    return Comparison(a.name, b.name, tok_model.name, len(ids), n, windows, context, kl / n,
                      math.exp(nll_a / n), math.exp(nll_b / n), time.perf_counter() - t0)


def _context(lm: Any) -> int:
    n = getattr(lm.config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n >= 2 else 1 << 30


def _measure(lm_a: Any, lm_b: Any, ids: list[int], context: int, name_a: str, name_b: str
             ) -> tuple[float, float, float, int, int]:
    """Sums over positions of KL(A || B) and both NLLs, the positions and the windows."""
    import torch

    kl = nll_a = nll_b = 0.0
    n = windows = 0
    with torch.inference_mode():
        for start in range(0, len(ids), context):
            window = ids[start:start + context]
            if len(window) < 2:
                break
            x = torch.tensor([window], dtype=torch.long)
            la = torch.log_softmax(lm_a(x).logits[0, :-1].double(), dim=-1)
            lb = la if lm_b is lm_a else torch.log_softmax(lm_b(x).logits[0, :-1].double(),
                                                           dim=-1)
            if la.shape != lb.shape:
                raise InvalidRequest(f"models {name_a!r} and {name_b!r} predict over "
                                     f"{la.shape[-1]} and {lb.shape[-1]} tokens: not the same "
                                     "vocabulary", field="model_b")
            nxt = torch.tensor(window[1:], dtype=torch.long).unsqueeze(-1)
            kl += float((la.exp() * (la - lb)).sum())
            nll_a -= float(la.gather(-1, nxt).sum())
            nll_b -= float(lb.gather(-1, nxt).sum())
            n += len(window) - 1
            windows += 1
    return kl, nll_a, nll_b, n, windows
