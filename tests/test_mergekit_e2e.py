"""The same mergekit config run by mergekit and by `mergepipe merge CONFIG.yml` (and the API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.cli.main import main
from tests import api_helpers, hf_family
from tests.catalogs import new_catalog

TASK_ARITHMETIC = """\
merge_method: task_arithmetic
base_model: {base}
models:
  - model: {base}
  - model: {e0}
    parameters: {{weight: 0.5}}
  - model: {e1}
    parameters: {{weight: 1.0}}
  - model: {e2}
    parameters: {{weight: 0.3}}
parameters: {{lambda: 0.8}}
dtype: float32
"""
LINEAR = """\
merge_method: linear
base_model: {base}
models:
  - model: {base}
    parameters: {{weight: 1.0}}
  - model: {e0}
    parameters: {{weight: 1.0}}
  - model: {e1}
    parameters: {{weight: 2.0}}
dtype: float32
"""
LORA = """\
merge_method: task_arithmetic
base_model: {base}
models:
  - model: {base}+{a0}
    parameters: {{weight: 1.0}}
  - model: {e1}
    parameters: {{weight: 0.5}}
dtype: float32
"""


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mk")
    fam = hf_family.make_family(root / "data", arch="llama")
    fam["a0"] = hf_family.make_lora(fam["base"], root / "data" / "a0", seed=5)
    return fam


def write_config(path: Path, template: str, family: dict[str, Path]) -> Path:
    path.write_text(template.format(**{k: str(v) for k, v in family.items()}))
    return path


def run_mergekit(config: Path, out: Path) -> dict[str, torch.Tensor]:
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions
    cfg = MergeConfiguration.model_validate(yaml.safe_load(config.read_text()))
    # lora_merge_dtype float32: mergekit otherwise rounds base+adapter to the base's bf16 first.
    run_merge(cfg, str(out), options=MergeOptions(
        copy_tokenizer=False, write_model_card=False, quiet=True,
        lora_merge_cache=str(out) + "-lora", lora_merge_dtype="float32"))
    return hf_family.state_dict(out)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("template", [TASK_ARITHMETIC, LINEAR], ids=["task_arithmetic", "linear"])
def test_config_both_ways_gives_the_same_model(template: str, family: dict[str, Path],
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "merge.yml", template, family)
    catalog = str(new_catalog(tmp_path, "c"))
    rc, out, err = cli(capsys, "--catalog", catalog, "merge", str(config), "--out",
                       str(tmp_path / "ours"), "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["expert_bytes_read"] == summary["full_read_bytes"]
    ours = hf_family.state_dict(tmp_path / "ours")
    theirs = run_mergekit(config, tmp_path / "mergekit")
    assert ours.keys() == theirs.keys()
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=2e-6, msg=k)
    with Catalog(catalog) as cat:
        from mergepipe.catalog.models import list_models
        names = {m.name: m for m in list_models(cat)}
    assert names["base"].base is None and names["e0"].base == "base"
    # A second run matches the registered models by path instead of ingesting again.
    rc, out, err = cli(capsys, "--catalog", catalog, "merge", str(config), "--out",
                       str(tmp_path / "again"), "--budget", "0.5")
    assert rc == 0, err
    assert "registered" not in err
    with Catalog(catalog) as cat:
        assert len(list_models(cat)) == len(names) + 1  # the second output only


def test_lora_reference_base_plus_adapter(family: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "lora.yml", LORA, family)
    catalog = str(new_catalog(tmp_path, "c"))
    rc, out, err = cli(capsys, "--catalog", catalog, "merge", str(config),
                       "--out", str(tmp_path / "ours"), "--json")
    assert rc == 0, err
    with Catalog(catalog) as cat:
        from mergepipe.catalog.models import get_model
        assert get_model(cat, "a0").kind == "lora"
    ours = hf_family.state_dict(tmp_path / "ours")
    theirs = run_mergekit(config, tmp_path / "mergekit")
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=2e-6, msg=k)


def test_cli_refusals_are_one_line_naming_file_and_key(family: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "passthrough.yml"
    bad.write_text(f"merge_method: passthrough\nbase_model: {family['base']}\nmodels:\n"
                   f"  - model: {family['e0']}\nparameters: {{t: 0.5}}\n")
    catalog = str(new_catalog(tmp_path, "c"))
    rc, out, err = cli(capsys, "--catalog", catalog, "merge", str(bad),
                       "--out", str(tmp_path / "o"))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1
    # mergekit refuses it too: the base_model is appended, two inputs to passthrough
    assert err.startswith(f"mergepipe merge: error: {bad}: models: passthrough copies one model")
    # a Hub id is read from the Hub (tests/test_hub.py); offline, from the local cache only
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    missing = tmp_path / "hub.yml"
    missing.write_text("merge_method: ties\nbase_model: meta-llama/Llama-3.2-1B\nmodels: [x]\n"
                       "parameters: {weight: 1}\n")
    rc, _, err = cli(capsys, "--catalog", catalog, "merge", str(missing),
                     "--out", str(tmp_path / "o"))
    assert rc != 0 and err.count("\n") == 1
    assert "base_model: hf://meta-llama/Llama-3.2-1B: not in the local Hub cache" in err
    rc, _, err = cli(capsys, "--catalog", catalog, "merge", str(bad),
                     "--op", "ties", "--out", str(tmp_path / "o"))
    assert rc == 2 and "--op cannot be combined with a config file" in err


def test_api_config_yaml(family: dict[str, Path], tmp_path: Path) -> None:
    settings = api_helpers.settings_for(tmp_path, data_roots=(family["base"].parent.resolve(),))
    # Paths relative to the (first) data root, as POST /v1/models takes them.
    text = TASK_ARITHMETIC.format(base="base", e0="e0", e1="e1", e2="e2")
    with api_helpers.client_for(settings) as client:
        # A dry run has no side effects: a path that is not registered is a 409 naming the key.
        r = client.post("/v1/plans", json={"config_yaml": text, "budget": {"fraction": 0.5}})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["field"] == "config_yaml.base_model"
        assert client.get("/v1/models").json()["models"] == []
        # A merge queues the ingestions of its paths, then itself.
        r = client.post("/v1/merges", json={"config_yaml": text, "output": {"name": "ta"}})
        assert r.status_code == 202, r.text
        done = api_helpers.wait(client, f"/v1/merges/{r.json()['id']}")
        assert done["status"] == "succeeded", done
        assert (settings.output_root / "ta" / "README.md").exists()
        # Registered now: the paths match the models and the dry run plans.
        r = client.post("/v1/plans", json={"config_yaml": text, "budget": {"fraction": 0.5}})
        assert r.status_code == 200, r.text
        assert r.json()["operator"] == "task_arithmetic"
        r = client.post("/v1/merges", json={"config_yaml": text.replace("task_arithmetic",
                                                                         "passthrough"),
                                            "output": {"name": "ms"}})
        # a passthrough is accepted (tests/test_passthrough_merge.py), this one copies two
        # models and a base: refused as mergekit refuses it, naming the key
        assert r.status_code == 422
        assert r.json()["error"]["field"] == "config_yaml.models"
        assert "passthrough copies one model" in r.json()["error"]["message"]
        # a chat template is written by the merge (tests/test_mergekit_vocab.py); a dry run
        # writes no files and says so rather than dropping it
        templated = text.rstrip("\n") + "\nchat_template: '{% for m in messages %}{{ m }}{% endfor %}'\n"
        r = client.post("/v1/plans", json={"config_yaml": templated})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "config_yaml.tokenizer"
        r = client.post("/v1/merges", json={"config_yaml": text, "base": "base",
                                            "output": {"name": "x"}})
        assert r.status_code == 422 and "not both" in r.text
        outside = text.replace("model: e1", f"model: {tmp_path}")
        r = client.post("/v1/merges", json={"config_yaml": outside, "output": {"name": "y"}})
        assert r.status_code == 403, r.text
