"""Bearer token on mutating endpoints, body size limit, and data-root / output-root confinement."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mergepipe.core.errors import Conflict, Forbidden, InvalidRequest
from mergepipe.storage.paths import check_name, confine_input, output_dir, temp_dirs
from tests.api_helpers import assert_error, client_for, settings_for

TOKEN = "s3cret-token"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[TestClient]:
    (tmp_path / "data").mkdir()
    with client_for(settings_for(tmp_path, api_token=TOKEN, max_body_bytes=2048)) as c:
        yield c


def test_mutating_endpoints_need_the_bearer_token(secured: TestClient, tmp_path: Path) -> None:
    c = secured
    body = {"name": "m", "path": str(tmp_path / "data")}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": "Bearer"}, {"Authorization": TOKEN}):
        r = c.post("/v1/models", json=body, headers=headers)
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(c.post("/v1/merges", json={}, headers=headers), 401, "unauthorized")
    # a mergekit config names paths on the server's disk: it needs the token too
    cfg = {"config_yaml": "merge_method: linear\nmodels:\n  - model: a\n"}
    assert_error(c.post("/v1/plans", json=cfg), 401, "unauthorized")
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert c.post("/v1/plans", json=cfg, headers=ok).status_code != 401
    # past the token check, the request itself is judged
    r = c.post("/v1/merges", json={}, headers=ok)
    assert_error(r, 422, "invalid_request")
    # reads need no token
    assert c.get("/healthz").status_code == 200
    assert c.get("/v1/models").status_code == 200
    assert c.post("/v1/sql", json={"sql": "SELECT 1"}).status_code == 200


def test_giant_bodies_are_413(secured: TestClient) -> None:
    c = secured
    big = {"sql": "SELECT 1 -- " + "x" * 5000}
    assert_error(c.post("/v1/sql", json=big), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"sql": "SELECT 1 -- '
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = c.post("/v1/sql", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413, "payload_too_large")
    assert c.post("/v1/sql", json={"sql": "SELECT 1"}).status_code == 200


def test_confine_input(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (root / "link").symlink_to(tmp_path / "secret")
    (root / "inner").symlink_to(root / "a")
    assert confine_input(str(root / "a"), [root]) == (root / "a").resolve()
    assert confine_input("a", [root]) == (root / "a").resolve()
    assert confine_input("inner", [root]) == (root / "a").resolve()
    for bad in ("../secret", str(root / "link"), "link/x", "/", str(tmp_path), "a/../../secret"):
        with pytest.raises(Forbidden):
            confine_input(bad, [root])
    with pytest.raises(InvalidRequest):
        confine_input("a/missing", [root])
    with pytest.raises(Forbidden):
        confine_input(str(root / "a"), [])


def test_output_names_stay_one_segment_under_the_root(tmp_path: Path) -> None:
    assert output_dir(tmp_path, "ok-1.v2_x") == tmp_path.resolve() / "ok-1.v2_x"
    for bad in ("", "..", "../x", "a/b", ".hidden", "a..b", "x" * 200, "a\\b", "a b", "ü"):
        with pytest.raises(InvalidRequest):
            check_name(bad, "output.name")
    (tmp_path / "taken").mkdir()
    with pytest.raises(Conflict):
        output_dir(tmp_path, "taken")
    (tmp_path / ".x.tmp-123").mkdir()
    (tmp_path / ".x.old-123").mkdir()
    assert temp_dirs(tmp_path) == [tmp_path / ".x.tmp-123"]


def test_a_full_queue_is_429(tmp_path: Path) -> None:
    from mergepipe.catalog import queue

    (tmp_path / "data" / "m").mkdir(parents=True)
    with client_for(settings_for(tmp_path, max_queued_jobs=3)) as c:
        assert isinstance(c.app, FastAPI)
        cat = c.app.state.mergepipe.cat
        # three queued jobs the workers were never handed: they stay queued
        held = queue.enqueue(cat, ingests=[
            queue.NewIngestJob(f"held-{i}", "full", str(tmp_path / "data" / "m"), None)
            for i in range(3)]).ingest_ids
        assert queue.job_counts(cat)[0] == 3
        err = assert_error(c.post("/v1/models", json={"name": "m", "path": "m"}),
                           429, "too_many_jobs")
        assert "limit 3" in err["message"]
        queue.finish_ingest_job(cat, held[0], error="gave up", done_bytes=0, total_bytes=0)
        assert queue.job_counts(cat)[0] == 2
        assert c.post("/v1/models", json={"name": "m", "path": "m"}).status_code == 202
