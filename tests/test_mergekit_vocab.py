"""mergekit's tokenizer options that re-index the embeddings (a union of differing
vocabularies, another model's vocabulary, padding to a multiple, `tokenizer.tokens`) and its
built-in chat templates, against mergekit 0.1.5 run on a tiny Llama family whose models carry
differing 64-token tokenizers built here: every token's rows bit-equal, the same tokenizer
files (tests/tokenizer_parity.check_vocab)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import find_model, model_tensors
from mergepipe.cli.main import main
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_tokenizer import BUNDLED
from mergepipe.jobs.config import load_config
from mergepipe.jobs.replay import replay
from tests import mergekit_parity as mp
from tests import tokenizer_parity as tk
from tests.catalogs import new_catalog

# The quick default variant (a padded union with tokens: and a built-in template) runs in
# tests/test_mergekit_slices.py, in one mergekit run with the slice configs.


@pytest.mark.slow
def test_vocabulary_options_equal_mergekit_all(tmp_path: Path) -> None:
    """linear, ties and task_arithmetic over each option, and every built-in template."""
    pytest.importorskip("mergekit")
    fam = tk.differing_family(tmp_path / "fam")
    cfgs = tk.vocab_configs(fam, methods=("linear", "ties", "task_arithmetic"),
                            templates=BUNDLED)
    mp.run_mergekit(cfgs, tmp_path)
    tk.check_vocab(cfgs, tmp_path)


def _merge(db: str, cfg: dict[str, Any], out: Path, *extra: str) -> dict[str, Any]:
    (out.parent / f"{out.name}.yml").write_text(yaml.safe_dump(cfg))
    argv = ["--catalog", db, "merge", str(out.parent / f"{out.name}.yml"), "--out", str(out),
            "--json", *extra]
    assert main(argv) == 0
    return json.loads((out / "manifest.json").read_text())


def test_budgeted_merge_reindexes_whole_and_replays(tmp_path: Path) -> None:
    """At budget 0.4: the other tensors within the budget, the vocabulary tensors read whole
    and counted apart (4 models x 2 tensors of 64 x 32 bf16); 96 rows, zz appended last; the
    output a model of its own; replay redoes the re-indexing, every tensor equal."""
    fam = tk.differing_family(tmp_path / "fam")
    cfg = tk.vocab_configs(fam)["task_arithmetic-pad"]
    db = str(new_catalog(tmp_path, "cat"))
    part = _merge(db, cfg, tmp_path / "part", "--budget", "0.4")
    got = mp.load_raw(tmp_path / "part")
    assert [got[k].shape[0] for k in ("model.embed_tokens.weight", "lm_head.weight")] == [96, 96]
    assert part["tokenizer"]["vocab_bytes_read"] == 4 * 2 * 64 * 32 * 2
    assert (part["tokenizer"]["vocabulary"], part["tokenizer"]["rows"]) == (89, 96)
    assert 0 < part["expert_bytes_read"] <= part["budget_bytes"] < part["full_read_bytes"]
    assert tk.ids(tmp_path / "part")["zz"] == 88
    cat = Catalog(db)
    try:
        row = find_model(cat, "part")
        assert row is not None and row.base is None
        result = replay(cat, part["merge_id"])
        assert result.match and not result.mismatched_tensors
    finally:
        cat.close()


@pytest.mark.slow
def test_budgeted_merge_reindexes_at_full_read(tmp_path: Path) -> None:
    """At budget 0.4 the other tensors follow the budgeted plan while the vocabulary tensors
    are the full read's, bit for bit."""
    fam = tk.differing_family(tmp_path / "fam")
    cfg = tk.vocab_configs(fam)["task_arithmetic-pad"]
    db = str(new_catalog(tmp_path, "cat"))
    _merge(db, cfg, tmp_path / "part", "--budget", "0.4")
    _merge(db, cfg, tmp_path / "full")
    a, b = mp.load_raw(tmp_path / "part"), mp.load_raw(tmp_path / "full")
    vocab = ("model.embed_tokens.weight", "lm_head.weight")
    assert all(torch.equal(a[k], b[k]) for k in vocab)
    assert any(not torch.equal(a[k], b[k]) for k in a if k not in vocab)


@pytest.mark.slow
def test_resized_expert_equals_mergekit_all(tmp_path: Path) -> None:
    """An expert fine-tuned with added tokens (embed_tokens and lm_head of 68 rows, the base
    64): linear, ties and task_arithmetic over a union (gaining its tokens) and the base's
    vocabulary (dropping them), every token's rows equal mergekit's."""
    pytest.importorskip("mergekit")
    cfgs = tk.resized_configs(tk.resized_family(tmp_path / "fam"),
                              methods=("linear", "ties", "task_arithmetic"))
    mp.run_mergekit(cfgs, tmp_path)
    tk.check_vocab(cfgs, tmp_path)


def test_resized_expert_without_reindexing_is_refused_naming_expert_and_tensor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The expert with resized embeddings ingests (its embeddings recorded with their own 68
    rows); a merge of it that does not re-index the embeddings (no tokenizer option) is
    refused in one line naming the expert and the tensor, as mergekit refuses it; the same
    config with tokenizer_source: union merges it (the output has its added tokens' rows)."""
    fam = tk.resized_family(tmp_path / "fam")
    cfg = tk.resized_configs(fam)["task_arithmetic-resized-union"]
    plain = {k: v for k, v in cfg.items() if k != "tokenizer_source"}
    db = str(new_catalog(tmp_path, "cat"))
    (tmp_path / "plain.yml").write_text(yaml.safe_dump(plain))
    assert main(["--catalog", db, "merge", str(tmp_path / "plain.yml"), "--out",
                 str(tmp_path / "plain")]) != 0
    # (the other lines: the config's models registered first, a note on the arithmetic)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert re.search(r"experts\[1\]\.model: expert 'e1[^']*': tensor '(lm_head|model\."
                     r"embed_tokens)\.weight' has 68 rows, 64 in the base 'base[^']*' .*"
                     "tokenizer option that re-indexes", err[0]), err
    assert not (tmp_path / "plain").exists()
    cat = Catalog(db)
    try:
        row = find_model(cat, "e1")
        assert row is not None and row.status == "ready"
        shapes = {t.name: t.shape for t in model_tensors(cat, "e1")}
        assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (68, 32)
    finally:
        cat.close()
    manifest = _merge(db, cfg, tmp_path / "union")
    assert (manifest["tokenizer"]["vocabulary"], manifest["tokenizer"]["rows"]) == (92, 92)
    got = mp.load_raw(tmp_path / "union")
    e1 = mp.load_raw(fam["e1"])
    ids = tk.ids(tmp_path / "union")
    # n64..n67 only e1 has: the output's rows are e1's (task arithmetic: w * e1 + (1 - w) *
    # base's fill, the base's fill being e1's row too)
    for i, t in enumerate(tk.ADDED):
        assert torch.equal(got["lm_head.weight"][ids[t]], e1["lm_head.weight"][64 + i].float())


def test_resized_tensor_other_than_vocabulary_rows_is_refused(tmp_path: Path) -> None:
    """Ingestion accepts an expert's vocabulary tensors with more rows only: fewer rows, another
    width, or another tensor resized stays refused, naming the file and the tensor."""
    from safetensors.torch import load_file, save_file

    from mergepipe.catalog.queue import NewIngestJob
    from mergepipe.core.errors import InvalidCheckpoint
    from mergepipe.jobs.ingest import run_ingestion

    fam = mp.make_family(tmp_path / "fam")
    cat = Catalog(new_catalog(tmp_path, "cat"))
    try:
        run_ingestion(cat, NewIngestJob("base", "full", str(fam["base"]), None))
        cases = {"model.embed_tokens.weight": lambda t: t[:60],
                 "lm_head.weight": lambda t: torch.cat([t, t], dim=1),
                 "model.norm.weight": lambda t: torch.cat([t, t])}
        for k, (name, change) in enumerate(cases.items()):
            tensors = load_file(str(fam["e1"] / "model.safetensors"))
            tensors[name] = change(tensors[name]).contiguous()
            path = tmp_path / f"x{k}"
            path.mkdir()
            save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
            with pytest.raises(InvalidCheckpoint, match=rf"model.safetensors: tensor "
                                                        rf"'{name}' has shape"):
                run_ingestion(cat, NewIngestJob(f"x{k}", "full", str(path), "base"))
    finally:
        cat.close()


def test_embeddings_of_fewer_rows_are_refused_naming_the_option(tmp_path: Path) -> None:
    """Experts are deltas of the base's tensors: a model with fewer embedding rows than the
    base is refused when the config is read, naming the option and the model."""
    fam = tk.differing_family(tmp_path / "fam")
    cfg = json.loads((fam["base"] / "config.json").read_text())
    (fam["base"] / "config.json").write_text(json.dumps({**cfg, "vocab_size": 70}))
    cat = Catalog(new_catalog(tmp_path, "cat"))
    try:
        with pytest.raises(InvalidRequest, match=r"^tokenizer_source: .*/e0 has 64 embedding "
                                                 "rows .*, fewer than the base's 70"):
            load_config(cat, yaml.safe_dump({**mp.config("task_arithmetic", fam, None),
                                             "tokenizer_source": "union"}))
    finally:
        cat.close()


@pytest.mark.parametrize(("tokenizer", "field", "words"), [
    ({"source": "union", "tokens": {"zz": {"source": "/nowhere/e9"}}},
     "tokenizer.tokens.zz.source", "'/nowhere/e9' is not one of the config's models"),
    ({"source": "union", "tokens": {"zz": {"source": {"kind": "model_token", "model": "E1",
                                                      "token": "nope"}}}},
     "tokenizer.tokens.zz.source.token", "has no token 'nope'"),
    ({"source": "union", "tokens": {"zz": {}}}, "tokenizer.tokens.zz.source",
     "needs a source"),
    ({"source": "union", "tokens": {"w50": {"source": "E1"}}}, "tokenizer.tokens.w50.source",
     "has no token 'w50'"),
    ({"source": "union", "pad_to_multiple_of": 0}, "tokenizer.pad_to_multiple_of",
     "must be a positive integer, got 0"),
])
def test_bad_tokenizer_input_is_one_error_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer: dict[str, Any],
        field: str, words: str) -> None:
    fam = tk.differing_family(tmp_path / "fam")
    e1 = str(fam["e1"])
    text = yaml.safe_dump({**mp.config("task_arithmetic", fam, None), "tokenizer": tokenizer})
    text = text.replace("E1", e1)
    db = new_catalog(tmp_path, "cat")
    cat = Catalog(db)
    try:
        with pytest.raises(InvalidRequest) as e:
            load_config(cat, text)
        assert e.value.field == field and words in e.value.message, e.value.message
    finally:
        cat.close()
    (tmp_path / "c.yml").write_text(text)
    assert main(["--catalog", str(db), "merge", str(tmp_path / "c.yml"), "--out",
                 str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{field}: " in err[0] and words in err[0], err


def test_passthrough_refuses_what_would_move_the_embeddings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Layer stacking copies tensors and runs no re-indexing: a union of differing vocabularies
    is refused there, naming the option (the same vocabulary is still accepted)."""
    fam = tk.differing_family(tmp_path / "fam")
    cfg: dict[str, Any] = {"merge_method": "passthrough", "tokenizer_source": "union",
                           "slices": [{"sources": [{"model": str(fam[m]), "layer_range": r}]}
                                      for m, r in (("base", [0, 1]), ("e1", [1, 2]))]}
    (tmp_path / "p.yml").write_text(yaml.safe_dump(cfg))
    argv = ["--catalog", str(new_catalog(tmp_path, "cat")), "merge", str(tmp_path / "p.yml"),
            "--out", str(tmp_path / "out")]
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer_source: union: the output vocabulary (87 tokens" in err[0]
    tk.save_tokenizer(fam["e1"], tk.vocab())
    assert main([*argv, "--json"]) == 0


def test_http_merge_runs_the_tokenizer_options_as_the_cli(tmp_path: Path) -> None:
    """POST /v1/merges with a config re-indexing the embeddings (a union over the expert with
    added tokens, a built-in template, a model named by path relative to the data root): the
    merge runs in the service's worker and its output equals the CLI's, tensors and tokenizer
    files; a tokenizer source outside the data roots is refused (403, naming the key); a dry
    run (POST /v1/plans) still refuses the options, which write files."""
    from tests import api_helpers

    fam = tk.resized_family(tmp_path / "fam")
    cfg = tk.resized_configs(fam)["task_arithmetic-resized-union"]
    cli = _merge(str(new_catalog(tmp_path, "cat")), {**cfg, "chat_template": "chatml"},
                 tmp_path / "cli")
    root = fam["base"].parent.resolve()
    rel = yaml.safe_dump({**cfg, "chat_template": "chatml"}).replace(f"{root}/", "")
    (tmp_path / "svc").mkdir()
    settings = api_helpers.settings_for(tmp_path / "svc", data_roots=(root,))
    with api_helpers.client_for(settings) as client:
        r = client.post("/v1/merges", json={"config_yaml": rel, "output": {"name": "u"}})
        assert r.status_code == 202, r.text
        done = api_helpers.wait(client, f"/v1/merges/{r.json()['id']}")
        assert done["status"] == "succeeded", done
        manifest = client.get(f"/v1/merges/{r.json()['id']}/manifest").json()
        assert manifest["tokenizer"]["rows"] == cli["tokenizer"]["rows"] == 92
        outside = yaml.safe_dump({**cfg, "tokenizer_source": str(tmp_path)})
        r = client.post("/v1/merges", json={"config_yaml": outside, "output": {"name": "o"}})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["field"] == "config_yaml.tokenizer_source", r.text
        r = client.post("/v1/plans", json={"config_yaml": rel})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "config_yaml.tokenizer", r.text
    out = settings.output_root / "u"
    ours, ref = mp.load_raw(out), mp.load_raw(tmp_path / "cli")
    assert sorted(ours) == sorted(ref) and all(torch.equal(ours[k], ref[k]) for k in ref)
    assert tk.tokenizer_files(out) == tk.tokenizer_files(tmp_path / "cli")
    assert tk.ids(out)["n64"] == 88


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_reindexed_tensor_past_its_dtype_is_refused_before_the_stage_changes(
        tmp_path: Path, bad: float) -> None:
    """The re-indexed vocabulary tensors are spliced into the staged output after the writer
    ran: one holding Inf or NaN (a float16 output of rows past 65504) is refused naming the
    tensor and its dtype, and the staged file is left as it was."""
    from safetensors.torch import save_file

    from mergepipe.executor.stream import ExecutionResult
    from mergepipe.executor.writer import OutputTensor
    from mergepipe.jobs.reindex import _splice

    save_file({"embed": torch.zeros(4, 2, dtype=torch.float16)}, str(tmp_path / "m.safetensors"))
    before = (tmp_path / "m.safetensors").read_bytes()
    result = ExecutionResult([OutputTensor("embed", "F16", (4, 2), "m.safetensors", "0")], "0",
                             0, {}, {}, 0, 0, 0, 0.0)
    merged = torch.ones(6, 2, dtype=torch.float16)
    merged[5, 1] = bad
    with pytest.raises(InvalidRequest, match=r"output tensor 'embed'.*Inf or NaN in float16"):
        _splice(tmp_path, result, {"embed": merged})
    assert (tmp_path / "m.safetensors").read_bytes() == before
