"""What an operator watches: /metrics after merges and a failed job, request ids end to end,
JSON log lines."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mergepipe.core import logs
from tests.api_helpers import (
    client_for,
    make_family,
    register_family,
    run_merge,
    settings_for,
    ties_body,
    wait,
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(name, sorted labels) -> value of every sample of a scrape."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_jobs_bytes_requests_and_sql(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    family = make_family(tmp_path / "data" / "family")
    with client_for(settings_for(tmp_path)) as client:
        register_family(client, family)
        caplog.set_level(logging.INFO)
        ok = [run_merge(client, ties_body(f"m{i}", fraction=0.5)) for i in range(2)]
        # a job that fails while it runs: an expert's file grew after ingestion
        with (family["e1"] / "model.safetensors").open("ab") as f:
            f.write(b"\0" * 8)
        r = client.post("/v1/merges", json=ties_body("broken"), headers={"X-Request-ID": "req-7"})
        assert r.status_code == 202, r.text
        assert r.headers["x-request-id"] == "req-7"
        failed = wait(client, f"/v1/merges/{r.json()['id']}")
        assert failed["status"] == "failed", failed
        assert client.post("/v1/sql", json={"sql": "SELECT 1"}).status_code == 200
        client.get("/v1/models/nobody")
        scrape = client.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    got = samples(scrape.text)

    def v(name: str, **labels: str) -> float:
        return got.get((name, tuple(sorted(labels.items()))), 0.0)

    assert v("mergepipe_jobs_run_total", kind="merge", status="succeeded") == 2
    assert v("mergepipe_jobs_run_total", kind="merge", status="failed") == 1
    assert v("mergepipe_jobs_run_total", kind="ingest", status="succeeded") == 4
    assert v("mergepipe_job_duration_seconds_count", kind="merge", status="succeeded") == 2
    assert v("mergepipe_jobs", kind="merge", status="succeeded") == 2
    assert v("mergepipe_jobs", kind="merge", status="failed") == 1
    assert v("mergepipe_jobs", kind="ingest", status="succeeded") == 4
    assert v("mergepipe_queue_depth", kind="merge") == 0
    assert v("mergepipe_catalog_up") == 1
    expert = sum(m["expert_bytes_read"] for m in ok)
    assert expert > 0 and v("mergepipe_bytes_read_total", kind="expert") == expert
    assert v("mergepipe_bytes_read_total", kind="base") == sum(m["base_bytes_read"] for m in ok)
    assert v("mergepipe_http_requests_total", method="POST", route="/v1/merges",
             status="202") == 3
    assert v("mergepipe_http_requests_total", method="POST", route="/v1/sql", status="200") == 1
    assert v("mergepipe_http_requests_total", method="GET", route="/v1/models/{name}",
             status="404") == 1
    assert v("mergepipe_sql_slots") >= 1 and v("mergepipe_sql_slots_in_use") == 0
    # the failed job's log lines carry the id of the POST that queued it
    lines = [r for r in caplog.records if r.name.startswith("mergepipe.jobs")]
    assert lines, "the merge jobs logged nothing"
    assert {getattr(r, "request_id", None) for r in lines} >= {"req-7"}


def test_request_ids_are_echoed_made_and_recorded_on_the_job(tmp_path: Path) -> None:
    family = make_family(tmp_path / "data" / "family")
    with client_for(settings_for(tmp_path)) as client:
        made = client.get("/healthz").headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", made)
        # an id that is not well formed is replaced, never echoed
        bad = client.get("/healthz", headers={"X-Request-ID": "a b\x7f" + "x" * 200})
        assert re.fullmatch(r"[0-9a-f]{32}", bad.headers["x-request-id"])
        r = client.post("/v1/models", json={"name": "base", "path": str(family["base"]),
                                            "kind": "full"}, headers={"X-Request-ID": "ing-42"})
        assert r.headers["x-request-id"] == "ing-42"
        wait(client, "/v1/models/base")
        rows = client.post("/v1/sql", json={"sql": "SELECT request_id FROM ingest_jobs"}).json()
        assert rows["rows"] == [["ing-42"]]
        err = client.get("/v1/merges/m-nope", headers={"X-Request-ID": "e-1"})
        assert err.status_code == 404 and err.headers["x-request-id"] == "e-1"


def test_metrics_need_the_read_token(tmp_path: Path) -> None:
    s = settings_for(tmp_path, read_token="r" * 24)
    with client_for(s) as client:
        assert client.get("/metrics").status_code == 401
        ok = client.get("/metrics", headers={"Authorization": "Bearer " + "r" * 24})
        assert ok.status_code == 200 and "mergepipe_catalog_up 1.0" in ok.text


def test_json_log_lines_carry_the_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("info", "json")
        with logs.request_context("abc-1"):
            logging.getLogger("mergepipe.test").info("merged %d tensors", 3)
        logging.getLogger("mergepipe.test").warning("outside")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert lines[0]["message"] == "merged 3 tensors" and lines[0]["request_id"] == "abc-1"
    assert lines[0]["level"] == "INFO" and lines[0]["logger"] == "mergepipe.test"
    assert lines[1]["request_id"] == "-"
