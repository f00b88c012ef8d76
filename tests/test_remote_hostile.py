"""Issue 29, the remote findings, against the attacker's own servers on loopback and the app
in-process: redirects out of the remote roots (same host, another port, a closed port), the
token across origins and from https down to http, encoded separators and dot segments,
trickling headers and bodies and a silent remote held past the job's time limit, a config
naming a URL resolved without a request thread touching the network. The load check and the
lying HEAD run against a real server: tests/test_remote_load.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mergepipe.core import checkpoint_limits
from mergepipe.core.checkpoint_limits import CheckpointLimits
from mergepipe.core.errors import InvalidRequest
from mergepipe.storage.locations import parse_url
from mergepipe.storage.remote import check_size
from tests import factory
from tests.api_helpers import assert_error, client_for, settings_for, wait
from tests.hostile_remotes import Redirector, Trickler, self_signed
from tests.remote_servers import environ_for, file_server, free_port

TOKEN = "hub-token-for-tests"
WEIGHTS = "model.safetensors"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A web root with a checkpoint under /allowed and another under /secret."""
    root = tmp_path / "site"
    base = factory.make_base(root / "allowed" / "base", seed=0)
    factory.make_base(root / "secret" / "base", seed=9)
    factory.make_lora(base, root / "allowed" / "adapter", seed=5)
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("MERGEPIPE_HTTP_TOKEN", TOKEN)
    monkeypatch.setenv("MERGEPIPE_REMOTE_BACKOFF_S", "0.01")
    return root


def ingest(c, name: str, url: str, timeout: float = 30.0) -> dict:
    r = c.post("/v1/models", json={"name": name, "path": url})
    assert r.status_code == 202, r.text
    return wait(c, f"/v1/models/{name}", timeout=timeout)


def test_redirects_out_of_the_roots_are_refused_without_saying_where(site: Path,
                                                                     tmp_path: Path) -> None:
    closed = free_port()
    main, outside = Redirector(site), Redirector(site)
    with main.serve() as url, outside.serve() as other:
        main.redirects.update({
            "/allowed/same-host/model.safetensors": f"{url}/secret/base/{WEIGHTS}",
            "/allowed/relative/model.safetensors": f"../../secret/base/{WEIGHTS}",
            "/allowed/other-port/model.safetensors": f"{other}/secret/base/{WEIGHTS}",
            "/allowed/closed-port/model.safetensors": f"http://127.0.0.1:{closed}/x/{WEIGHTS}",
            "/allowed/encoded/model.safetensors": f"/allowed/..%2Fsecret/base/{WEIGHTS}",
            "/allowed/moved/model.safetensors": f"/allowed/base/{WEIGHTS}",
        })
        settings = settings_for(tmp_path, remote_roots=(f"{url}/allowed",))
        with client_for(settings) as c:
            messages = []
            for n in ("same-host", "relative", "other-port", "closed-port", "encoded"):
                job = ingest(c, n, f"{url}/allowed/{n}/{WEIGHTS}")
                assert job["status"] == "failed", job
                msg = job["error"]
                assert "redirected the request to a location outside the allowed remote " \
                    "roots" in msg, msg
                for leak in ("secret", str(closed), other.rsplit(":", 1)[1], "refused"):
                    assert leak not in msg, (leak, msg)
                messages.append(msg.replace(n, "N"))
            assert len(set(messages)) == 1  # a closed port reads like any other refusal
            # inside the roots, a redirect is followed, with the token (the same origin)
            moved = ingest(c, "moved", f"{url}/allowed/moved/{WEIGHTS}")
            assert moved["status"] == "ready", moved
    assert not [p for p in main.paths() if "secret" in p], main.paths()
    assert outside.seen == []  # the other port was never asked
    assert {s.authorization for s in main.seen} == {f"Bearer {TOKEN}"}


def test_the_token_goes_only_to_the_origin_named(site: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, cert = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    tls, plain, third = Redirector(site), Redirector(site), Redirector(site)
    with tls.serve(ctx) as https, plain.serve() as http, third.serve() as far:
        assert https.startswith("https://127.0.0.1:")
        # https -> http on the same host (another port: its own origin), in the roots
        tls.redirects[f"/allowed/down/{WEIGHTS}"] = f"{http}/allowed/base/{WEIGHTS}"
        # another origin, then back to the origin named: no token after the first hop
        tls.redirects[f"/allowed/away/{WEIGHTS}"] = f"{far}/allowed/back/{WEIGHTS}"
        third.redirects[f"/allowed/back/{WEIGHTS}"] = f"{https}/allowed/base/{WEIGHTS}"
        settings = settings_for(tmp_path, remote_roots=(f"{https}/allowed", f"{http}/allowed",
                                                        f"{far}/allowed"))
        with client_for(settings) as c:
            assert ingest(c, "down", f"{https}/allowed/down/{WEIGHTS}")["status"] == "ready"
            assert ingest(c, "away", f"{https}/allowed/away/{WEIGHTS}")["status"] == "ready"
    named = [s for s in tls.seen if s.path in (f"/allowed/down/{WEIGHTS}",
                                               f"/allowed/away/{WEIGHTS}")]
    assert named and all(s.authorization == f"Bearer {TOKEN}" for s in named)
    back = [s for s in tls.seen if s.path == f"/allowed/base/{WEIGHTS}"]
    assert back and all(s.authorization is None for s in back), back
    assert third.seen and all(s.authorization is None for s in third.seen)
    assert plain.seen and all(s.authorization is None for s in plain.seen)  # no downgrade


@pytest.mark.parametrize("tail", [
    "..%2Fsecret/base", "..%2fsecret/base", "%2e%2e%2fsecret/base", "%2E%2E/secret/base",
    "..%5Csecret/base", "%252e%252e%252fsecret/base", "..;/secret/base", "x/%00/base",
])
def test_encoded_separators_and_dot_segments_are_refused(tail: str, site: Path,
                                                         tmp_path: Path) -> None:
    server = Redirector(site)
    with server.serve() as url:
        settings = settings_for(tmp_path, remote_roots=(f"{url}/allowed",))
        with client_for(settings) as c:
            r = c.post("/v1/models", json={"name": "x", "path": f"{url}/allowed/{tail}"})
            msg = assert_error(r, 422, "invalid_request", "path")["message"]
            assert "path segment" in msg, msg
            config = (f"merge_method: task_arithmetic\nbase_model: {url}/allowed/base\n"
                      f"models:\n  - model: {url}/allowed/{tail}\n"
                      "    parameters: {weight: 1.0}\n")
            r = c.post("/v1/merges", json={"config_yaml": config, "output": {"name": "o"}})
            assert_error(r, 422, "invalid_request")
    assert server.seen == []


def test_urls_have_one_canonical_form() -> None:
    assert str(parse_url("HTTP://Hub:80/a%41/b%20c/%7Eu")) == "http://hub/aA/b%20c/~u"
    assert str(parse_url("https://hub:443/x")) == "https://hub/x"
    assert parse_url("http://h/a").child("b c.json").name == "b c.json"
    for bad in ("http://h:0/x", "http://h:65536/x", "http://h/%ff"):
        with pytest.raises(InvalidRequest):
            parse_url(bad)


@pytest.mark.parametrize("mode", ["headers", "body", "silent"])
def test_a_trickling_or_silent_remote_fails_its_job_at_the_time_limit(
        mode: str, site: Path, tmp_path: Path) -> None:
    slow = Trickler(mode, interval=0.1,
                    data=(site / "allowed" / "base" / WEIGHTS).read_bytes())
    with slow.serve() as url:
        settings = settings_for(tmp_path, remote_roots=(f"{url}/allowed",), workers=1,
                                job_timeout_s=1.5)
        with client_for(settings) as c:
            t0 = time.monotonic()
            job = ingest(c, "slow", f"{url}/allowed/m/{WEIGHTS}", timeout=15)
            took = time.monotonic() - t0
            assert job["status"] == "failed", job
            assert "time limit of 1.5 s (MERGEPIPE_JOB_TIMEOUT_S)" in job["error"], job
            assert took < 1.5 + 2.0, took  # not 30 s x 5 attempts
            # the worker is free: the next job (local) runs
            factory.make_base(tmp_path / "data" / "ok", seed=1)
            r = c.post("/v1/models", json={"name": "ok", "path": str(tmp_path / "data" / "ok")})
            assert r.status_code == 202
            assert wait(c, "/v1/models/ok", timeout=15)["status"] == "ready"


def test_a_trickling_s3_body_fails_its_job_at_the_time_limit(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a byte every 4 s: each read returns within the read timeout, the first one after the
    # deadline (only the watchdog ends the body at the deadline itself)
    slow = Trickler("body", interval=4.0,
                    data=(site / "allowed" / "base" / WEIGHTS).read_bytes())
    with slow.serve() as endpoint:
        for k, v in environ_for(endpoint).items():
            monkeypatch.setenv(k, v)
        settings = settings_for(tmp_path, remote_roots=("s3://bucket/allowed",), workers=1,
                                job_timeout_s=1.5)
        with client_for(settings) as c:
            t0 = time.monotonic()
            job = ingest(c, "slow", f"s3://bucket/allowed/m/{WEIGHTS}", timeout=15)
            took = time.monotonic() - t0
    assert job["status"] == "failed", job
    assert "time limit of 1.5 s (MERGEPIPE_JOB_TIMEOUT_S)" in job["error"], job
    assert took < 1.5 + 2.0, took


def test_a_config_naming_urls_is_resolved_by_its_jobs_not_the_request(site: Path,
                                                                      tmp_path: Path) -> None:
    slow = Trickler("headers", interval=0.1)
    with slow.serve() as slow_url, file_server(site) as url:
        settings = settings_for(tmp_path, remote_roots=(f"{url}/allowed", f"{slow_url}/allowed"),
                                workers=1, job_timeout_s=1.0)
        with client_for(settings) as c:
            config = (f"merge_method: task_arithmetic\nbase_model: {url}/allowed/base\n"
                      f"models:\n  - model: {slow_url}/allowed/e0\n"
                      "    parameters: {weight: 1.0}\n")
            t0 = time.monotonic()
            r = c.post("/v1/merges", json={"config_yaml": config, "output": {"name": "slow"}})
            assert r.status_code == 202, r.text
            assert time.monotonic() - t0 < 1.0 and slow.connections == 0
            assert wait(c, f"/v1/merges/{r.json()['id']}", timeout=20)["status"] == "failed"
            # an adapter named by URL is found to be one by its ingestion job
            config = (f"merge_method: task_arithmetic\nbase_model: {url}/allowed/base\n"
                      f"models:\n  - model: {url}/allowed/adapter\n"
                      "    parameters: {weight: 1.0}\n")
            r = c.post("/v1/merges", json={"config_yaml": config, "output": {"name": "lora"}})
            assert r.status_code == 202, r.text
            done = wait(c, f"/v1/merges/{r.json()['id']}", timeout=60)
            assert done["status"] == "succeeded", done
            assert c.get("/v1/models/adapter").json()["kind"] == "lora"


def test_a_size_claim_over_the_cap_is_refused_at_the_stat() -> None:
    old = checkpoint_limits.install(CheckpointLimits(max_file_bytes=100))
    try:
        assert check_size("http://h/x", 100) == 100
        with pytest.raises(InvalidRequest, match="claims 101 bytes, over the limit of 100 for "
                           "one file .MERGEPIPE_MAX_FILE_BYTES"):
            check_size("http://h/x", 101)
    finally:
        checkpoint_limits.install(old)
