"""mergekit `slices:` configs (passthrough layer stacking; another method over one whole-model
slice) against mergekit 0.1.5 run on the same tiny 4-layer Llama family: 0 differing bytes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from mergepipe.api import Catalog as Api
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.settings import Settings
from mergepipe.jobs.config import load_config
from tests import mergekit_parity as mp
from tests import tokenizer_parity as tk
from tests.catalogs import new_catalog

pytest.importorskip("mergekit")

LAYERS = 4


def _src(path: Path, a: int, b: int, **params: Any) -> dict[str, Any]:
    return {"model": str(path), "layer_range": [a, b], **({"parameters": params} if params else {})}


def configs(fam: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Slice configs shaped like mergekit's examples (frankenmerges, scaled copies)."""
    return {
        # 7 layers from three models, overlapping ranges; embeddings from e0, norm/lm_head base
        "stack": {"merge_method": "passthrough", "slices": [
            {"sources": [_src(fam["e0"], 0, 2)]}, {"sources": [_src(fam["e1"], 1, 4)]},
            {"sources": [_src(fam["base"], 2, 4)]}]},
        # mergekit's scaled frankenmerge: filters at the slice, a gradient at a source, in f32
        "scaled": {"merge_method": "passthrough", "dtype": "float32", "out_dtype": "bfloat16",
                   "base_model": str(fam["e2"]), "parameters": {"scale": 1.0}, "slices": [
                       {"sources": [_src(fam["e2"], 0, 3)], "parameters": {"scale": [
                           {"filter": "o_proj", "value": 0.0},
                           {"filter": "down_proj", "value": 0.5}]}},
                       {"sources": [_src(fam["e1"], 3, 4, scale=[0.25, 2.0])]},
                       {"sources": [_src(fam["e0"], 1, 4, scale=[0.5, 1.5])]}]},
        # passthrough of one model under models: (a copy), written in float16
        "copy": {"merge_method": "passthrough", "out_dtype": "float16",
                 "models": [{"model": str(fam["e1"])}]},
        # the last slice's model ties lm_head to its embeddings: no lm_head written (as mergekit)
        "tied": {"merge_method": "passthrough", "slices": [
            {"sources": [_src(fam["e0"], 0, 2)]},
            {"sources": [_src(fam["t1"], 2, 4)], "parameters": {"scale": 0.5}}]},
        # slerp over one slice of every layer: the models: config it equals
        "slerp": {"merge_method": "slerp", "base_model": str(fam["base"]), "slices": [
            {"sources": [_src(fam["base"], 0, 4), _src(fam["e0"], 0, 4)],
             "parameters": {"t": [0.0, 0.3, 1.0]}}]},
    }


QUICK = ("stack", "slerp")


def _ours(cat: Catalog, cfg: dict[str, Any], out: Path) -> dict[str, torch.Tensor]:
    if cfg["merge_method"] == "passthrough":
        Api.over(cat, Settings.from_env({})).merge(cfg, out=out, progress=False)
        return mp.load_raw(out)
    return mp.run_ours(cat, cfg, out)[1]


def tied_copy(src: Path, dst: Path) -> Path:
    """`src` without lm_head, its config saying the embeddings are tied to it."""
    from tests import factory

    tensors = {k: v for k, v in factory.load(src).items() if k != "lm_head.weight"}
    cfg = {**json.loads((src / "config.json").read_text()), "tie_word_embeddings": True}
    return factory.save_checkpoint(dst, tensors, config=cfg)


def check(cfgs: dict[str, dict[str, Any]], theirs: dict[str, Any], root: Path) -> None:
    """Our run of each config against mergekit's output `root / name`."""
    cat = Catalog(new_catalog(root, "cat"))
    try:
        for name, cfg in cfgs.items():
            ours = _ours(cat, cfg, root / f"ours-{name}")
            assert sorted(ours) == sorted(theirs[name]), name
            differ, compared, _ = mp.differences(ours, theirs[name])
            assert (differ, compared) == (0, sum(t.numel() for t in theirs[name].values())), name
            mine = json.loads((root / f"ours-{name}" / "config.json").read_text())
            ref = json.loads((root / name / "config.json").read_text())
            assert mine["num_hidden_layers"] == ref["num_hidden_layers"], name
    finally:
        cat.close()


def test_slices_and_tokenizer_options_equal_mergekit_quick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One mergekit run: layer stacking from three models (7 output layers), the same stack
    read by range from the fake Hub (mergekit reading local copies), and slerp over one slice
    (the same tensor names, every entry bit-equal, the same layer count), and an inline chat
    template and another model's tokenizer (tests/test_mergekit_tokenizer.py: the same tensors
    and tokenizer files), a padded union of differing vocabularies with tokens: and a
    built-in template, and a union over an expert with added tokens and resized embeddings
    (tests/test_mergekit_vocab.py: every token's rows equal)."""
    fam = tk.family(tmp_path / "fam", layers=LAYERS)
    slices = {n: c for n, c in configs({**fam, "t1": fam["e1"]}).items() if n in QUICK}
    tokens = {n: c for n, c in tk.configs(fam).items() if n in tk.QUICK}
    vocab = {n: c for n, c in tk.vocab_configs(tk.differing_family(tmp_path / "vfam")).items()
             if n in tk.VOCAB_QUICK}
    vocab |= {n: c for n, c in tk.resized_configs(tk.resized_family(tmp_path / "rfam")).items()
              if n in tk.RESIZED_QUICK}
    theirs = mp.run_mergekit({**slices, **tokens, **vocab, "hub": slices["stack"]}, tmp_path)
    check(slices, theirs, tmp_path)
    tk.check(tokens, theirs, tmp_path)
    tk.check_vocab(vocab, tmp_path)
    from tests.fake_hub import FakeHub, Repo, serve_as_hub

    repos = {f"acme/{n}": Repo.from_dir(fam[n]) for n in ("base", "e0", "e1")}
    with serve_as_hub(FakeHub(repos), tmp_path / "hf-cache", monkeypatch) as hub:
        remote = json.loads(json.dumps(slices["stack"]).replace(str(fam["e0"]), "acme/e0")
                            .replace(str(fam["e1"]), "acme/e1").replace(str(fam["base"]),
                                                                        "hf://acme/base"))
        cat = Catalog(new_catalog(tmp_path, "hub-cat"))
        try:
            ours = _ours(cat, remote, tmp_path / "ours-hub")
        finally:
            cat.close()
        assert sum(hub.body_bytes.values()) > 0  # read from the Hub, not from disk
    assert sorted(ours) == sorted(theirs["hub"])
    assert mp.differences(ours, theirs["hub"])[:2] == (
        0, sum(t.numel() for t in theirs["hub"].values()))


@pytest.mark.slow
def test_slices_equal_mergekit_all(tmp_path: Path) -> None:
    fam = mp.make_family(tmp_path / "fam", layers=LAYERS)
    fam["t1"] = tied_copy(fam["e1"], tmp_path / "fam" / "t1")
    cfgs = configs(fam)
    check(cfgs, mp.run_mergekit(cfgs, tmp_path), tmp_path)


def test_slices_refusals(tmp_path: Path) -> None:
    """What mergekit refuses, or MergePipe cannot run, is refused naming the key."""
    fam = mp.make_family(tmp_path / "fam", layers=LAYERS)
    two = {"merge_method": "passthrough", "slices": [
        {"sources": [_src(fam["e0"], 0, 2), _src(fam["e1"], 0, 2)]}]}
    missing = {"merge_method": "passthrough", "slices": [{"sources": [_src(fam["e0"], 2, 6)]}]}
    with Api(new_catalog(tmp_path, "api")) as api:
        with pytest.raises(InvalidRequest, match=r"slices\[0\]\.sources: passthrough copies one"):
            api.merge(two, out=tmp_path / "o1", progress=False)
        with pytest.raises(InvalidRequest, match=r"slices\[0\]\.sources\[0\]\.layer_range: "
                                                 r".* has 4 layers, the range \[2, 6\]") as e:
            api.merge(missing, out=tmp_path / "o2", progress=False)
        assert e.value.field == "slices[0].sources[0].layer_range"
        assert not (tmp_path / "o2").exists() and api.sql("SELECT * FROM merges").rows == []
    cat = Catalog(new_catalog(tmp_path, "cat"))
    try:
        piece = {"sources": [_src(fam["base"], 0, 2), _src(fam["e0"], 0, 2)]}
        partial: dict[str, Any] = {"merge_method": "ties", "base_model": str(fam["base"]),
                                   "slices": [piece]}
        with pytest.raises(InvalidRequest, match=r"slices\[0\]\.sources\[0\]\.layer_range: "
                                                 "ties over a slice of 2 layers of a 4-layer"):
            load_config(cat, yaml.safe_dump(partial))
        stacked = {**partial, "slices": [copy.deepcopy(piece) for _ in range(2)]}
        with pytest.raises(InvalidRequest, match="slices: ties over 2 slices is not supported"):
            load_config(cat, yaml.safe_dump(stacked))
        with pytest.raises(InvalidRequest, match="passthrough .* no budgeted plan"):
            load_config(cat, yaml.safe_dump(two))
    finally:
        cat.close()


def test_cli_passthrough_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mergepipe merge` on a slices config: each output layer is its source layer, renumbered;
    embeddings from the first slice's model, norm and lm_head from the last one's; a scaled
    slice times its scale (hand-computed from the checkpoints); config.json has 3 layers."""
    from mergepipe.cli.main import main
    from tests import factory

    fam = mp.make_family(tmp_path / "fam", layers=LAYERS)
    cfg = {"merge_method": "passthrough", "slices": [
        {"sources": [_src(fam["e1"], 3, 4)]},
        {"sources": [_src(fam["e0"], 0, 2)], "parameters": {"scale": 0.5}}]}
    (tmp_path / "c.yml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    assert main(["--catalog", str(new_catalog(tmp_path, "cat")), "merge",
                 str(tmp_path / "c.yml"), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["operator"] == "passthrough"
    got, e0, e1 = mp.load_raw(out), factory.load(fam["e0"]), factory.load(fam["e1"])
    q = "self_attn.q_proj.weight"
    assert torch.equal(got[f"model.layers.0.{q}"], e1[f"model.layers.3.{q}"])
    assert torch.equal(got[f"model.layers.2.{q}"], e0[f"model.layers.1.{q}"] * 0.5)
    assert torch.equal(got["model.embed_tokens.weight"], e1["model.embed_tokens.weight"])
    assert torch.equal(got["lm_head.weight"], e0["lm_head.weight"] * 0.5)
    assert len(got) == len(e0) - LAYERS * 9 + 3 * 9  # 9 tensors per layer
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    # a second run: refused without --overwrite; with it, no stale tensor stays
    (out / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    argv = ["--catalog", str(new_catalog(tmp_path, "cat2")), "merge", str(tmp_path / "c.yml"),
            "--out", str(out)]
    assert main(argv) != 0
    assert "not empty" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--json"]) == 0
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]


def test_large_outputs_are_written_in_shards(tmp_path: Path) -> None:
    """Memory holds one shard: with a 20 KB limit the 7-layer stack is written in shards with
    an index, tensor for tensor the same as the one-file output."""
    from mergepipe.core.mergekit_slices import parse_slices
    from mergepipe.executor.slices import write_slices

    fam = mp.make_family(tmp_path / "fam", layers=LAYERS)
    cfg = parse_slices(configs({**fam, "t1": fam["e1"]})["stack"])
    paths = {str(p): str(p) for p in fam.values()}
    one = write_slices(cfg, paths, tmp_path / "one")
    many = write_slices(cfg, paths, tmp_path / "many", shard_bytes=20_000)
    shards = sorted((tmp_path / "many").glob("model-*.safetensors"))
    assert len(shards) > 3 and not (tmp_path / "many" / "model.safetensors").exists()
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    assert sorted({v for v in index["weight_map"].values()}) == [p.name for p in shards]
    a, b = mp.load_raw(tmp_path / "one"), mp.load_raw(tmp_path / "many")
    assert one.tensors == many.tensors == len(a) == len(index["weight_map"])
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in a.values())
