"""The model card's `base_model` holds Hugging Face Hub ids (what the Hub reads there), never
catalog names: the id a model records (config.json `_name_or_path` as org/name, or a Hub cache
directory it was read from); models without one, and merge outputs, are left out; with no id the
key is absent. Checked on real merges through the CLI, and each id with huggingface_hub's own
repository-id validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mergepipe.cli.main import main
from tests import factory
from tests.catalogs import new_catalog

validate_repo_id = pytest.importorskip("huggingface_hub.utils").validate_repo_id


def card(out: Path) -> dict:
    text = (out / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text[4:].partition("\n---\n")[0])


def _name_or_path(ckpt: Path, value: str) -> Path:
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "_name_or_path": value}))
    return ckpt


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("hub")
    base = _name_or_path(factory.make_base(root / "base"), "org-a/base-7b")
    # e0: an id recorded by transformers; e1: a local path there (no id); e2: read from the
    # Hub's cache layout, no _name_or_path
    e0 = _name_or_path(factory.make_expert(base, root / "e0", seed=1), "org-b/code.v2")
    e1 = _name_or_path(factory.make_expert(base, root / "e1", seed=2), "/home/me/ckpt/e1")
    e2 = factory.make_expert(base, root / "hub" / "models--org-c--math_7b" / "snapshots" / "0ab1",
                             seed=3)
    cfg = json.loads((e2 / "config.json").read_text())
    cfg.pop("_name_or_path", None)
    (e2 / "config.json").write_text(json.dumps(cfg))
    db = str(new_catalog(root))
    assert main(["--catalog", db, "ingest", str(base), "--name", "base"]) == 0
    for name, path in (("e0", e0), ("e1", e1), ("e2", e2)):
        assert main(["--catalog", db, "ingest", str(path), "--name", name, "--base", "base"]) == 0
    return db, root


def test_base_model_lists_the_hub_ids_the_inputs_record(setup, tmp_path) -> None:
    db, _ = setup
    out = tmp_path / "m"
    assert main(["--catalog", db, "merge", "--base", "base", "--experts", "e0,e1,e2",
                 "--op", "task_arithmetic", "--out", str(out)]) == 0
    meta = card(out)
    assert meta["base_model"] == ["org-a/base-7b", "org-b/code.v2", "org-c/math_7b"]
    assert meta["base_model_relation"] == "merge"
    for repo in meta["base_model"]:
        validate_repo_id(repo)
    assert meta["mergepipe"]["base"] == "base"  # the catalog names stay in mergepipe:
    assert [e["model"] for e in meta["mergepipe"]["experts"]] == ["e0", "e1", "e2"]

    # a merge output as an expert: it carries its base's config.json, not an id of its own
    out2 = tmp_path / "m2"
    assert main(["--catalog", db, "merge", "--base", "base", "--experts", "m,e1",
                 "--op", "linear", "--out", str(out2)]) == 0
    assert card(out2)["base_model"] == ["org-a/base-7b"]
    assert "base_model_relation" not in card(out2)


def test_without_hub_ids_the_card_has_no_base_model(setup, tmp_path) -> None:
    db, root = setup
    # a new family whose configs record no id
    base = factory.make_base(root / "local-base", seed=5)
    e = factory.make_expert(base, root / "local-e", seed=6)
    assert main(["--catalog", db, "ingest", str(base), "--name", "lb"]) == 0
    assert main(["--catalog", db, "ingest", str(e), "--name", "le", "--base", "lb"]) == 0
    out = tmp_path / "local"
    assert main(["--catalog", db, "merge", "--base", "lb", "--experts", "le", "--op", "linear",
                 "--out", str(out)]) == 0
    meta = card(out)
    assert "base_model" not in meta and "base_model_relation" not in meta
    assert meta["mergepipe"]["base"] == "lb"
