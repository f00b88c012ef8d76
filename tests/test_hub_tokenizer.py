"""mergekit's tokenizer options on models named by Hub ids (the tests' fake Hub on loopback):
the same merge, tensors and tokenizer files as from local copies; the tokenizer files read
through the Hub store (the local cache offline), the vocabulary tensors by range."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.cli.main import main
from mergepipe.core.errors import InvalidRequest
from mergepipe.jobs.config import load_config
from mergepipe.jobs.reindex import _read_tensor
from tests import mergekit_parity as mp
from tests import tokenizer_parity as tk
from tests.fake_hub import FakeHub, Repo, fill_cache, serve_as_hub

NAMES = ("base", "e0", "e1", "e2")


@pytest.fixture
def family(tmp_path: Path) -> dict[str, Path]:
    return tk.differing_family(tmp_path / "fam")


def start(family: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          drop: tuple[str, str] | None = None) -> Iterator[FakeHub]:
    repos = {f"acme/{n}": Repo.from_dir(family[n]) for n in NAMES}
    if drop is not None:
        del repos[f"acme/{drop[0]}"].files[drop[1]]
    with serve_as_hub(FakeHub(repos), tmp_path / "hf-cache", monkeypatch) as h:
        yield h


@pytest.fixture
def hub(family: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> Iterator[FakeHub]:
    yield from start(family, tmp_path, monkeypatch)


def configs(family: dict[str, Path], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same task_arithmetic config by local paths and by Hub ids; `source` a model's name
    (e1) or base / union."""
    local = tk._method("task_arithmetic", family, "float32")
    hubbed = json.loads(json.dumps(local))
    hubbed["base_model"] = "acme/base"
    for m, n in zip(hubbed["models"], ("e0", "e1", "e2"), strict=True):
        m["model"] = f"acme/{n}"
    named = source in NAMES
    local["tokenizer_source"] = str(family[source]) if named else source
    hubbed["tokenizer_source"] = f"acme/{source}" if named else source
    return local, hubbed


def merge(tmp_path: Path, name: str, cfg: dict[str, Any], *extra: str) -> dict[str, Any]:
    (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(cfg))
    argv = ["--catalog", str(tmp_path / f"{name}.duckdb"), "merge", str(tmp_path / f"{name}.yml"),
            "--out", str(tmp_path / name), "--json", *extra]
    assert main(argv) == 0
    return json.loads((tmp_path / name / "manifest.json").read_text())


def same_outputs(a: Path, b: Path, files: list[str]) -> None:
    ta, tb = mp.load_raw(a), mp.load_raw(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_a_vocabulary_tensor_is_read_by_range_from_the_hub(
        hub: FakeHub, family: dict[str, Path]) -> None:
    """The tensor alone (and the header) leaves the storage, not its whole file."""
    data = hub.repos["acme/e2"].files["model.safetensors"]
    header = 8 + int.from_bytes(data[:8], "little")
    got = _read_tensor(f"hf://acme/e2@{hub.repos['acme/e2'].sha}", "model.embed_tokens.weight")
    assert torch.equal(got, mp.load_raw(family["e2"])["model.embed_tokens.weight"])
    assert 0 < hub.body_bytes["acme/e2"] <= header + 64 * 32 * 2 < len(data)


@pytest.mark.parametrize("source", ["union", "base", "e1"])
def test_tokenizer_source_by_hub_ids_equals_the_local_merge(
        hub: FakeHub, family: dict[str, Path], tmp_path: Path, source: str) -> None:
    """At budget 0.4: the same tensors and tokenizer files; the vocabulary tensors read whole
    and counted as locally (4 models x 2 tensors of 64 x 32 bf16)."""
    local, hubbed = configs(family, source)
    a = merge(tmp_path, "local", local, "--budget", "0.4")
    b = merge(tmp_path, "hub", hubbed, "--budget", "0.4")
    files = a["tokenizer"]["files"]
    assert "tokenizer.json" in files and b["tokenizer"]["files"] == files
    same_outputs(tmp_path / "local", tmp_path / "hub", files)
    assert a["tokenizer"]["vocab_bytes_read"] == b["tokenizer"]["vocab_bytes_read"] \
        == 4 * 2 * 64 * 32 * 2
    assert b["tokenizer"]["models"] == ["acme/e0", "acme/e1", "acme/e2", "acme/base"]
    assert (a["tokenizer"]["vocabulary"], a["tokenizer"]["tokens_sha256"]) == \
        (b["tokenizer"]["vocabulary"], b["tokenizer"]["tokens_sha256"])


def test_union_by_hub_ids_offline_reads_the_local_cache(
        hub: FakeHub, family: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for n in NAMES:
        fill_cache(tmp_path / "hf-cache", f"acme/{n}", hub.repos[f"acme/{n}"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    local, hubbed = configs(family, "union")
    a = merge(tmp_path, "local", local)
    merge(tmp_path, "hub", hubbed)
    same_outputs(tmp_path / "local", tmp_path / "hub", a["tokenizer"]["files"])
    assert hub.network_requests() == 0


@pytest.mark.parametrize(("drop", "source", "message"), [
    ("base", "union", "hf://acme/base@{base}/tokenizer.json: missing (the output's vocabulary"),
    ("e1", "e1", "hf://acme/e1@{e1}/tokenizer.json: missing or not JSON"),
])
def test_a_tokenizer_file_missing_on_the_hub_is_refused_by_name(
        family: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        drop: str, source: str, message: str) -> None:
    for hub in start(family, tmp_path, monkeypatch, drop=(drop, "tokenizer.json")):
        _, hubbed = configs(family, source)
        with Catalog(tmp_path / "c.duckdb") as cat, pytest.raises(InvalidRequest) as e:
            load_config(cat, yaml.safe_dump(hubbed))
        shas = {n: hub.repos[f"acme/{n}"].sha for n in ("base", "e1")}
        assert message.format(**shas) in e.value.message
        assert e.value.field == "tokenizer_source"


def test_http_merge_by_hub_ids_runs_the_union_within_the_remote_roots(
        hub: FakeHub, family: dict[str, Path], tmp_path: Path) -> None:
    """POST /v1/merges of the union by Hub ids, the Hub and its storage host the remote roots:
    the output equals the local CLI merge (tensors and tokenizer files). The service takes
    Hub models as hf:// URLs."""
    from tests import api_helpers

    local, hubbed = configs(family, "union")
    hubbed["base_model"] = "hf://acme/base"
    for m in hubbed["models"]:
        m["model"] = f"hf://{m['model']}"
    a = merge(tmp_path, "local", local)
    (tmp_path / "svc").mkdir()
    settings = api_helpers.settings_for(tmp_path / "svc", remote_roots=("hf://acme", hub.storage))
    with api_helpers.client_for(settings) as client:
        r = client.post("/v1/merges", json={"config_yaml": yaml.safe_dump(hubbed),
                                             "output": {"name": "u"}})
        assert r.status_code == 202, r.text
        done = api_helpers.wait(client, f"/v1/merges/{r.json()['id']}")
        assert done["status"] == "succeeded", done
        manifest = client.get(f"/v1/merges/{r.json()['id']}/manifest").json()
    assert manifest["tokenizer"]["models"] == ["hf://acme/e0", "hf://acme/e1", "hf://acme/e2",
                                               "hf://acme/base"]
    same_outputs(tmp_path / "local", settings.output_root / "u", a["tokenizer"]["files"])
