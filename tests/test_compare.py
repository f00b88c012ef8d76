"""`compare` (Python, CLI, POST /v1/compare): teacher-forced KL(A || B) and perplexities of two
registered models, on a tiny real Llama family built here (tests/tiny_lm.py), checked against
a hand computation with torch."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import mergepipe
from mergepipe.cli.main import main
from mergepipe.evaluation import models as eval_models
from mergepipe.evaluation.compare import compare
from tests import api_helpers, catalogs, tiny_lm


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A base, an expert and an expert without tokenizer files, registered in a catalog."""
    root = tmp_path_factory.mktemp("lm")
    base = tiny_lm.make_lm(root / "data" / "base", seed=0)
    tiny_lm.make_lm_expert(base, root / "data" / "chat", seed=1)
    tiny_lm.make_lm_expert(base, root / "data" / "bare", seed=2, tokenizer=False)
    # the base's weights under a config that does not describe them, and one of no known type
    for name, change in (("narrow", {"hidden_size": 8}), ("alien", {"model_type": "alien"})):
        odd = tiny_lm.make_lm_expert(base, root / "data" / name, seed=3)
        config = json.loads((odd / "config.json").read_text())
        (odd / "config.json").write_text(json.dumps({**config, **change}))
    catalog = catalogs.new_catalog(root)
    with mergepipe.Catalog(catalog) as cat:
        cat.ingest(base, "base", progress=False)
        for name in ("chat", "bare", "narrow", "alien"):
            cat.ingest(root / "data" / name, name, base="base", progress=False)
    (root / "text.txt").write_text(" ".join([tiny_lm.TEXT] * 2))
    return {"root": root, "catalog": catalog, "text": root / "text.txt"}  # a path or a URL


def hand(a: Path, b: Path, text: str, tokens: int, context: int) -> tuple[float, float, float]:
    """KL(A || B) per token and both perplexities, computed directly: transformers' own loader,
    the tokenizers library, windows of `context` tokens."""
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    ids = Tokenizer.from_file(str(a / "tokenizer.json")).encode(text).ids[:tokens]
    ma = LlamaForCausalLM.from_pretrained(a, dtype=torch.float32).eval()
    mb = LlamaForCausalLM.from_pretrained(b, dtype=torch.float32).eval()
    kl, nll_a, nll_b, n = 0.0, 0.0, 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), context):
            w = torch.tensor([ids[s:s + context]])
            if w.shape[1] < 2:
                continue
            pa = torch.softmax(ma(w).logits[0, :-1].double(), -1)
            pb = torch.softmax(mb(w).logits[0, :-1].double(), -1)
            kl += float((pa * (pa.log() - pb.log())).sum())
            nll_a += float(torch.nn.functional.nll_loss(pa.log(), w[0, 1:], reduction="sum"))
            nll_b += float(torch.nn.functional.nll_loss(pb.log(), w[0, 1:], reduction="sum"))
            n += w.shape[1] - 1
    return kl / n, math.exp(nll_a / n), math.exp(nll_b / n)


def test_a_model_against_itself(family: dict[str, Any]) -> None:
    with mergepipe.Catalog(family["catalog"]) as cat:
        r = cat.compare("base", "base", tiny_lm.TEXT)
    assert r.kl == 0.0 and r.perplexity_a == r.perplexity_b > 1.0
    n = len(tiny_lm.TEXT.split()) + 1  # the words and [BOS]
    assert (r.tokens, r.positions, r.windows, r.tokenizer) == (n, n - 1, 1, "base")


def test_base_against_an_expert_is_the_hand_computation(family: dict[str, Any]) -> None:
    text = family["text"].read_text()  # 83 tokens: windows of the context, 64, and 19
    data = family["root"] / "data"
    with mergepipe.Catalog(family["catalog"]) as cat:
        r = compare(cat.db, "base", "chat", text)
        short = compare(cat.db, "base", "chat", text, tokens=10)
    kl, ppl_a, ppl_b = hand(data / "base", data / "chat", text, 10**6, 64)
    n = len(text.split()) + 1
    assert n > 64 and (r.tokens, r.positions, r.windows, r.context) == (n, n - 2, 2, 64)
    assert r.kl > 0 and r.kl == pytest.approx(kl, rel=1e-9)
    assert (r.perplexity_a, r.perplexity_b) == pytest.approx((ppl_a, ppl_b), rel=1e-9)
    assert r.perplexity_a != r.perplexity_b
    assert (short.tokens, short.positions, short.windows) == (10, 9, 1)
    assert short.kl == pytest.approx(hand(data / "base", data / "chat", text, 10, 64)[0],
                                     rel=1e-9)


def test_the_tokenizer_comes_from_a_model_that_has_one(family: dict[str, Any]) -> None:
    with mergepipe.Catalog(family["catalog"]) as cat:
        assert compare(cat.db, "bare", "chat", tiny_lm.TEXT).tokenizer == "chat"
        named = compare(cat.db, "bare", "bare", tiny_lm.TEXT, tokenizer="base")
        assert named.tokenizer == "base" and named.kl == 0.0
        with pytest.raises(mergepipe.InvalidRequest) as e:
            compare(cat.db, "bare", "bare", tiny_lm.TEXT)
        assert e.value.field == "tokenizer" and "'bare'" in e.value.message


@pytest.mark.parametrize(("name", "message"), [
    ("narrow", "its weights do not fit its config.json"),
    ("alien", "does not describe a causal LM transformers knows"),
])
def test_a_config_that_does_not_describe_the_weights(family: dict[str, Any], name: str,
                                                     message: str) -> None:
    with mergepipe.Catalog(family["catalog"]) as cat, \
            pytest.raises(mergepipe.InvalidRequest) as e:
        compare(cat.db, "base", name, tiny_lm.TEXT)
    assert e.value.field == "model_b" and f"model {name!r}" in e.value.message
    assert message in e.value.message and e.value.status == 422


def test_cli(family: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--catalog", str(family["catalog"]), "compare", "base", "chat",
            "--text", str(family["text"]), "--tokens", "20"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 20 and out["kl"] > 0
    assert main(args) == 0
    shown = capsys.readouterr().out
    assert f"KL(A || B)      {out['kl']:.6g} nats per token" in shown
    assert f"perplexity B    {out['perplexity_b']:.6g}" in shown


@pytest.mark.parametrize(("args", "message"), [
    (["base", "chat", "--text", "missing.txt"], "missing.txt: cannot read the text"),
    (["base", "nobody", "--text", "TEXT"], "model 'nobody' not found"),
    (["bare", "bare", "--text", "TEXT"], "neither model 'bare' nor 'bare' has tokenizer"),
    (["base", "chat", "--text", "TEXT", "--tokens", "1"], "tokens 1: at least 2"),
    (["base", "chat", "--text", "EMPTY"], "the text is 1 token(s) long"),
])
def test_cli_errors_are_one_line(family: dict[str, Any], capsys: pytest.CaptureFixture[str],
                                 args: list[str], message: str) -> None:
    (family["root"] / "empty.txt").write_text("")
    args = [str(family["text"]) if a == "TEXT" else str(family["root"] / "empty.txt")
            if a == "EMPTY" else str(family["root"] / a) if a.endswith(".txt") else a
            for a in args]
    assert main(["--catalog", str(family["catalog"]), "compare", *args]) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    with pytest.raises(eval_models.MissingExtra) as e:
        eval_models.transformers()
    assert "mergepipe[eval]" in e.value.message and e.value.status == 501


def test_api(family: dict[str, Any], tmp_path: Path) -> None:
    settings = api_helpers.settings_for(tmp_path, catalog=str(family["catalog"]))
    with api_helpers.client_for(settings) as c:
        ok = c.post("/v1/compare", json={"model_a": "base", "model_b": "chat",
                                         "text": tiny_lm.TEXT, "tokens": 12})
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert body["tokens"] == 12 and body["kl"] > 0 and body["tokenizer"] == "base"
        bad: list[tuple[dict[str, Any], int, str]] = [
            ({"model_a": "base", "model_b": "chat", "text": "x", "tokens": 1}, 422, "tokens"),
            ({"model_a": "base", "model_b": "chat", "text": "x", "tokens": 10**6}, 422,
             "tokens"),
            ({"model_a": "base", "model_b": "chat"}, 422, "text"),
            ({"model_a": "base", "model_b": "chat", "text": ""}, 422, "text"),
            ({"model_a": "base", "model_b": "chat", "text": "x", "extra": 1}, 422, "extra"),
            ({"model_a": "base", "model_b": "nobody", "text": "the cat"}, 404, "model_b"),
            ({"model_a": "bare", "model_b": "bare", "text": "the cat"}, 422, "tokenizer"),
        ]
        from mergepipe.service.routes import compare as route

        with route._ONE_AT_A_TIME:  # a comparison running: another is refused, not queued
            busy = c.post("/v1/compare", json={"model_a": "base", "model_b": "chat",
                                               "text": "the cat"})
        assert busy.status_code == 429 and "a comparison is running" in busy.text
        for payload, status, field in bad:
            r = c.post("/v1/compare", json=payload)
            assert r.status_code == status, (payload, r.text)
            assert r.json()["error"]["field"].startswith(field), (payload, r.text)
