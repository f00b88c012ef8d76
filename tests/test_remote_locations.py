"""URLs of remote checkpoints (parsing, canonical forms, confinement by whole path segments), the
drift rule of stamps, the retry loop's give-up and resume rules, and the remote settings."""

from __future__ import annotations

import pytest

from mergepipe.core.errors import Forbidden, InvalidRequest, RemoteUnavailable
from mergepipe.storage.locations import absolute, basename, is_url, join, parent, parse_url
from mergepipe.storage.paths import confine_url
from mergepipe.storage.remote import RemoteConfig, Transient, with_retries
from mergepipe.storage.store_types import FetchStats, Stamp


def test_urls_are_parsed_to_one_canonical_form() -> None:
    assert absolute("s3://models/fam/base/") == "s3://models/fam/base"
    assert absolute("HTTPS://Hub.Example.com:8443//org/m") == "https://hub.example.com:8443/org/m"
    assert join("s3://models/fam", "config.json") == "s3://models/fam/config.json"
    assert basename("s3://models/fam/base") == "base"
    assert parent("https://h/a/b/model.safetensors") == "https://h/a/b"
    assert join("/tmp/x", "y") == "/tmp/x/y" and not is_url("/tmp/s3://x")
    assert str(parse_url("s3://models")) == "s3://models"


@pytest.mark.parametrize("text, says", [
    ("ftp://host/x", "not supported"),
    ("https://user:pw@host/x", "credentials"),
    ("https://host/x?token=1", "no query"),
    ("s3://models/a/../b", "'..'"),
    ("s3://models/a/%2e%2e/b", "'..'"),
    ("s3://Bad_Bucket/x", "not a valid bucket"),
    ("https://ho st/x", "not a valid host"),
])
def test_bad_urls_are_refused_naming_why(text: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_url(text)


def test_confinement_is_by_whole_segments() -> None:
    roots = ["s3://models/team", "https://hub.example.com/org"]
    assert confine_url("s3://models/team/e0/", roots) == "s3://models/team/e0"
    assert confine_url("s3://models/team", roots) == "s3://models/team"
    assert confine_url("https://hub.example.com/org/m/resolve/main", roots)
    for outside in ("s3://models/team-b/e0", "s3://models/other", "s3://models2/team/e0",
                    "http://hub.example.com/org/m", "https://hub.example.com/orgx"):
        with pytest.raises(Forbidden, match="outside the allowed remote roots"):
            confine_url(outside, roots)
    with pytest.raises(Forbidden, match="MERGEPIPE_REMOTE_ROOTS"):
        confine_url("s3://models/team/e0", [])


def test_the_version_decides_then_the_etag_then_size_and_mtime() -> None:
    old = Stamp(10, 1, '"a"', "v1")
    assert Stamp(10, 2, '"b"', "v1").change_from(old) is None  # same version: unchanged
    assert Stamp(10, 1, '"a"', "v2").change_from(old) == "version v1 -> v2"
    assert Stamp(11, 1, '"a"', "v1").change_from(old) == "size 10 -> 11"
    assert Stamp(10, 5, '"b"').change_from(Stamp(10, 1, '"a"')) == 'ETag "a" -> "b"'
    assert Stamp(10, 5, '"a"').change_from(Stamp(10, 1, '"a"')) is None
    assert Stamp(10, 5).change_from(Stamp(10, 1)) == "mtime_ns 1 -> 5"


def test_retries_give_up_after_failures_in_a_row_and_resume_after_progress() -> None:
    cfg = RemoteConfig(attempts=3, backoff_s=0.0)
    stats, calls = FetchStats(), []

    def always_fails() -> None:
        calls.append(1)
        raise Transient("HTTP 503 SlowDown")

    with pytest.raises(RemoteUnavailable, match="s3://b/k: HTTP 503 SlowDown; gave up after 3"):
        with_retries("s3://b/k", cfg, stats, always_fails)
    assert len(calls) == 3 and stats.retries == 2

    done = [0]

    def progresses() -> str:  # each attempt gets 10 more bytes, then breaks, until 50
        done[0] += 10
        if done[0] < 50:
            raise Transient("reset")
        return "ok"

    assert with_retries("x", cfg, FetchStats(), progresses, lambda: done[0]) == "ok"


def test_remote_settings_come_from_the_environment() -> None:
    cfg = RemoteConfig.from_env({"MERGEPIPE_REMOTE_ATTEMPTS": "7", "MERGEPIPE_HTTP_TOKEN": "s3cr3t",
                                 "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert cfg.attempts == 7 and cfg.http_token == "s3cr3t"
    assert cfg.aws_value("AWS_ENDPOINT_URL") == "http://127.0.0.1:9"
    assert "s3cr3t" not in repr(cfg)  # a token never reaches a log line
    with pytest.raises(InvalidRequest, match="MERGEPIPE_REMOTE_ATTEMPTS='0' must be a number"):
        RemoteConfig.from_env({"MERGEPIPE_REMOTE_ATTEMPTS": "0"})
