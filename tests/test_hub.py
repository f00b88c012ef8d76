"""Hugging Face Hub sources against a fake Hub on loopback: hf:// locations and Hub ids in
mergekit configs, pinned to their commit, read by range through the Hub's redirect, budgeted,
equal to the same merge of local copies; the local cache read with no network."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import get_model
from mergepipe.catalog.queue import NewIngestJob
from mergepipe.core.errors import Forbidden, NotFound
from mergepipe.jobs.config import load_config
from mergepipe.jobs.ingest import run_ingestion
from mergepipe.jobs.merge import merge
from mergepipe.storage.remote import remote_scope
from tests import factory
from tests import mergekit_parity as mp
from tests.fake_hub import FakeHub, Repo, fill_cache, serve_as_hub

NAMES = ("base", "e0", "e1")


def sha_of(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


@pytest.fixture
def family(tmp_path: Path) -> dict[str, Path]:
    return mp.make_family(tmp_path / "local")


@pytest.fixture
def hub(family: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    repos = {f"acme/{n}": Repo.from_dir(family[n], sha_of(n)) for n in NAMES}
    with serve_as_hub(FakeHub(repos), tmp_path / "hf-cache", monkeypatch) as h:
        yield h


def ingest_config(cat: Catalog, text: str, budget: str) -> Any:
    request, resolved = load_config(cat, text, budget=budget)
    for job in resolved.to_ingest:
        run_ingestion(cat, job)
    return request


def config(base: str, e0: str, e1: str) -> str:
    return yaml.safe_dump({
        "merge_method": "task_arithmetic", "base_model": base, "dtype": "float32",
        "models": [{"model": e0, "parameters": {"weight": 0.7}},
                   {"model": e1, "parameters": {"weight": 0.3}}]})


def header_bytes(path: Path) -> int:
    data = (path / "model.safetensors").read_bytes()
    return 8 + int.from_bytes(data[:8], "little")


@pytest.mark.parametrize("budget", ["0.1", "1"])
def test_a_config_of_hub_ids_merges_within_the_budget_as_local_copies_do(
        budget: str, hub: FakeHub, family: dict[str, Path], tmp_path: Path) -> None:
    text = config("acme/base", "acme/e0", f"acme/e1@{sha_of('e1')}")
    with Catalog(tmp_path / "hub.duckdb") as cat:
        request = ingest_config(cat, text, budget)
        for n in NAMES:  # pinned to the commit the revision named
            assert any(m.path == f"hf://acme/{n}@{sha_of(n)}" for m in [
                get_model(cat, r.name) for r in cat.query("model_list")]), n
        before = dict(hub.body_bytes)
        ours = merge(cat, request, tmp_path / "from-hub")
        fetched = {r: hub.body_bytes[r] - before.get(r, 0) for r in hub.repos}
    experts = fetched["acme/e0"] + fetched["acme/e1"]
    headers = header_bytes(family["e0"]) + header_bytes(family["e1"])
    assert 0 < ours.expert_bytes_read <= ours.budget_bytes
    assert experts <= ours.budget_bytes + headers, (experts, ours.budget_bytes)
    if budget == "0.1":
        full = sum((family[n] / "model.safetensors").stat().st_size for n in ("e0", "e1"))
        assert experts < 0.2 * full
    with Catalog(tmp_path / "local.duckdb") as cat:
        request = ingest_config(cat, config(*(str(family[n]) for n in NAMES)), budget)
        local = merge(cat, request, tmp_path / "from-disk")
    assert local.plan_hash == ours.plan_hash
    a, b = factory.load(tmp_path / "from-hub"), factory.load(tmp_path / "from-disk")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_local_cache_is_read_offline_with_no_network(
        hub: FakeHub, family: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for n in NAMES:
        fill_cache(tmp_path / "hf-cache", f"acme/{n}", hub.repos[f"acme/{n}"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with Catalog(tmp_path / "c.duckdb") as cat:
        request = ingest_config(cat, config("acme/base", "acme/e0", "acme/e1"), "0.5")
        result = merge(cat, request, tmp_path / "out")
        assert get_model(cat, "e0").path == f"hf://acme/e0@{sha_of('e0')}"
    assert hub.network_requests() == 0
    assert result.expert_bytes_read > 0
    with Catalog(tmp_path / "c2.duckdb") as cat, pytest.raises(NotFound, match="local Hub cache"):
        run_ingestion(cat, NewIngestJob("x", "full", "hf://acme/missing", None, None, True))


def test_remote_roots_confine_the_hub_and_its_storage(hub: FakeHub, tmp_path: Path) -> None:
    job = NewIngestJob("base", "full", "hf://acme/base", None, None, True)
    with Catalog(tmp_path / "c.duckdb") as cat:
        with pytest.raises(Forbidden, match="outside the allowed remote roots"):
            run_ingestion(cat, job, remote_roots=["hf://other"])
        # the Hub may send the reads to its storage host only when that is a root too
        with remote_scope(["hf://acme"], 60), pytest.raises(Forbidden):
            run_ingestion(cat, job, remote_roots=["hf://acme"])
        roots = ["hf://acme", hub.storage]
        with remote_scope(roots, 60):
            model = run_ingestion(cat, job, remote_roots=roots)
    assert model.status == "ready" and model.path == f"hf://acme/base@{sha_of('base')}"
