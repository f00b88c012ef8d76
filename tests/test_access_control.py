"""Access control through the API: symbolic links out of the data roots (whole checkpoints, single
shards, config files, put in after the request was accepted), outputs confined to the output
root, and the bearer token on every mutating endpoint."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import NewIngestJob, enqueue
from tests import factory
from tests.api_helpers import (
    assert_error,
    client_for,
    make_family,
    register_family,
    settings_for,
    ties_body,
    wait,
)

SECRET = "secret-of-the-host-5e1b"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("acl")
    family = make_family(tmp / "data" / "family")
    outside = tmp / "outside"
    factory.make_expert(family["base"], outside / "expert", seed=7)
    (outside / "secret.json").write_text(json.dumps({"secret": SECRET}))
    settings = settings_for(tmp)
    with client_for(settings) as c:
        register_family(c, family)
        yield {"tmp": tmp, "family": family, "outside": outside, "client": c,
               "settings": settings}


def _copy_without(src: Path, dst: Path, skip: str) -> None:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != skip:
            shutil.copy(f, dst / f.name)


def _nothing_named(c: TestClient, name: str) -> None:
    assert c.get(f"/v1/models/{name}").status_code == 404
    rows = c.post("/v1/sql", json={"sql": f"SELECT count(*) FROM blocks WHERE model = '{name}'"})
    assert rows.json()["rows"] == [[0]]


def test_a_weight_file_linked_out_of_the_root_is_forbidden(env: dict[str, Any]) -> None:
    c, data, outside = env["client"], env["tmp"] / "data", env["outside"]
    d = data / "linked-weights"
    _copy_without(env["family"]["e1"], d, "model.safetensors")
    (d / "model.safetensors").symlink_to(outside / "expert" / "model.safetensors")
    err = assert_error(c.post("/v1/models", json={"name": "lw", "path": "linked-weights",
                                                  "base": "base"}), 403, "forbidden", "path")
    assert "model.safetensors" in err["message"] and "outside" in err["message"]
    _nothing_named(c, "lw")


def test_a_shard_linked_out_of_the_root_is_forbidden(env: dict[str, Any]) -> None:
    c, data, outside = env["client"], env["tmp"] / "data", env["outside"]
    sharded_out = factory.make_expert(env["family"]["base"], outside / "sharded", seed=8,
                                      shards=2)
    d = data / "linked-shard"
    d.mkdir()
    for f in sharded_out.iterdir():
        if f.name.endswith("00002.safetensors"):
            (d / f.name).symlink_to(f)  # one shard of the index points outside
        else:
            shutil.copy(f, d / f.name)
    err = assert_error(c.post("/v1/models", json={"name": "ls", "path": str(d),
                                                  "base": "base"}), 403, "forbidden", "path")
    assert "00002" in err["message"]
    _nothing_named(c, "ls")


def test_a_config_file_linked_out_of_the_root_is_forbidden(env: dict[str, Any]) -> None:
    """A base's config files are copied into every merge output: a link out is an exfiltration."""
    c, data, outside = env["client"], env["tmp"] / "data", env["outside"]
    d = data / "linked-config"
    _copy_without(env["family"]["base"], d, "tokenizer.json")
    (d / "tokenizer.json").symlink_to(outside / "secret.json")
    err = assert_error(c.post("/v1/models", json={"name": "lc", "path": "linked-config"}),
                       403, "forbidden", "path")
    assert "tokenizer.json" in err["message"]
    # the same through a mergekit config (paths in it are ingested on the fly)
    cfg = {"config_yaml": "merge_method: task_arithmetic\nbase_model: linked-config\nmodels:\n"
                          "  - {model: e1, parameters: {weight: 1}}\n", "budget": {"fraction": 1.0}}
    r = c.post("/v1/plans", json=cfg)
    assert r.status_code == 403, r.text
    _nothing_named(c, "lc")


def test_links_that_stay_inside_the_roots_are_followed(env: dict[str, Any]) -> None:
    """HF-cache style snapshots (links to blobs in the same root) keep working."""
    c, data = env["client"], env["tmp"] / "data"
    blobs, snap = data / "hub" / "blobs", data / "hub" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in env["family"]["e2"].iterdir():
        shutil.copy(f, blobs / f"blob-{f.name}")
        (snap / f.name).symlink_to(os.path.relpath(blobs / f"blob-{f.name}", snap))
    r = c.post("/v1/models", json={"name": "hub-e2", "path": "hub/snapshots/abc",
                                   "base": "base"})
    assert r.status_code == 202, r.text
    assert wait(c, "/v1/models/hub-e2")["status"] == "ready"


def test_a_link_put_into_the_base_after_ingestion_fails_the_merge(env: dict[str, Any]) -> None:
    """The directory changed after it was accepted: the merge job checks again, publishes
    nothing and copies nothing from outside."""
    c, data, outside = env["client"], env["tmp"] / "data", env["outside"]
    base2 = data / "base2"
    shutil.copytree(env["family"]["base"], base2)
    r = c.post("/v1/models", json={"name": "base2", "path": "base2"})
    assert r.status_code == 202, r.text
    assert wait(c, "/v1/models/base2")["status"] == "ready"
    r = c.post("/v1/models", json={"name": "e0-of-2", "path": str(env["family"]["e0"]),
                                   "base": "base2"})
    assert r.status_code == 202, r.text
    assert wait(c, "/v1/models/e0-of-2")["status"] == "ready"
    (base2 / "special_tokens_map.json").symlink_to(outside / "secret.json")
    body = ties_body("after-link", base="base2", experts=("e0-of-2",))
    r = c.post("/v1/merges", json=body)
    assert r.status_code == 202, r.text
    m = wait(c, f"/v1/merges/{r.json()['id']}")
    assert m["status"] == "failed", m
    assert "special_tokens_map.json" in m["error"] and "outside" in m["error"], m
    out = env["settings"].output_root
    assert not (out / "after-link").exists()
    for f in out.rglob("*"):
        assert not f.is_file() or SECRET not in f.read_text(errors="ignore"), f
    (base2 / "special_tokens_map.json").unlink()
    m = wait(c, f"/v1/merges/{c.post('/v1/merges', json=body).json()['id']}")
    assert m["status"] == "succeeded", m


def test_a_link_put_in_while_the_ingestion_was_queued_fails_it(tmp_path: Path) -> None:
    family = make_family(tmp_path / "data" / "family")
    (tmp_path / "outside.json").write_text("{}")
    settings = settings_for(tmp_path)
    with Catalog(settings.catalog) as cat:  # accepted while the server was down ...
        enqueue(cat, ingests=[NewIngestJob("base", "full", str(family["base"]), None)]).ingest_ids[0]
    (family["base"] / "generation_config.json").symlink_to(tmp_path / "outside.json")
    with client_for(settings) as c:  # ... and checked again when it runs
        m = wait(c, "/v1/models/base")
        assert m["status"] == "failed" and "generation_config.json" in m["error"], m


@pytest.mark.parametrize("name", ["/abs/path", "../escape", "a/../../b", "..", ".", "a/b",
                                  "a\\b", "\x00", "x" * 300, "%2e%2e", " spaced", "~root"])
def test_output_names_cannot_leave_the_output_root(env: dict[str, Any], name: str) -> None:
    c = env["client"]
    out = env["settings"].output_root
    before = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert_error(c.post("/v1/merges", json=ties_body(name)), 422, "invalid_request",
                 "output.name")
    after = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert after == before
    assert not (env["tmp"] / "escape").exists() and not Path("/abs/path").exists()


def test_every_mutating_endpoint_needs_the_token(tmp_path: Path) -> None:
    """Found from the app's routes, so that a new endpoint cannot forget the token."""
    (tmp_path / "data").mkdir()
    with client_for(settings_for(tmp_path, api_token="tok-123")) as c:
        spec = c.get("/openapi.json").json()["paths"]
        routes = [(m.upper(), path) for path, ops in spec.items() for m in ops
                  if m.upper() in ("POST", "PUT", "PATCH", "DELETE")]
        assert ("POST", "/v1/models") in routes and ("POST", "/v1/merges") in routes
        read_only = {("POST", "/v1/sql"), ("POST", "/v1/plans")}  # plans: token with a config
        for method, path in routes:
            if (method, path) in read_only:
                continue
            url = path.replace("{", "").replace("}", "")
            for headers in ({}, {"Authorization": "Bearer nope"}):
                r = c.request(method, url, json={}, headers=headers)
                assert_error(r, 401, "unauthorized")


@pytest.mark.parametrize("path", ["a" * 5000, "x/" * 3000, "/" + "b" * 300, "\udcff",
                                  "family/\x00", "family/e0/" + "../" * 2000])
def test_unusable_paths_are_4xx_not_500(env: dict[str, Any], path: str) -> None:
    c = env["client"]
    raw = json.dumps({"name": "odd", "path": path, "base": "base"})  # \udcff stays escaped
    r = c.post("/v1/models", content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()) == {"error"} and len(r.json()["error"]["message"]) < 1000
