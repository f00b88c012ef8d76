"""Start-up recovery: what was running when the server died is failed and cleaned; queued resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from mergepipe.catalog import queue, records
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import Job, NewIngestJob, enqueue
from mergepipe.core.request import build_request
from tests.api_helpers import (
    EXPERTS,
    client_for,
    make_family,
    register_family,
    settings_for,
    wait,
)


@pytest.mark.duckdb_only("the sole server of a DuckDB catalog fails at its start the jobs it "
                         "was running; on a shared catalog they are taken over after their "
                         "lease instead (tests/test_shared_workers.py)")
def test_restart_fails_running_jobs_removes_temp_outputs_and_resumes_queued(
        tmp_path: Path) -> None:
    from mergepipe.jobs.merge import submit_merge

    family = make_family(tmp_path / "data" / "family")
    settings = settings_for(tmp_path)
    with client_for(settings) as c:
        register_family(c, family)

    # The state a server killed mid-work leaves behind (written while no server runs).
    out = settings.output_root
    req = build_request(base="base", experts=[{"model": e} for e in EXPERTS], operator="ties",
                        params={"density": 0.5}, budget={"fraction": 0.5}, seed=1)
    with Catalog(settings.catalog) as cat:
        half = enqueue(cat, ingests=[NewIngestJob("half", "full", str(family["e0"]), "base")]).ingest_ids[0]
        queue.start_ingest_job(cat, half)
        later = enqueue(cat, ingests=[NewIngestJob("later", "full", str(family["e1"]), "base")]).ingest_ids[0]
        crashed = submit_merge(cat, req, "crashed", out / "crashed").merge_id
        records.mark_running(cat, str(crashed))
        resumed = submit_merge(cat, req, "resumed", out / "resumed").merge_id
    stage = out / ".crashed.tmp-deadbeef"
    stage.mkdir(parents=True)
    (stage / "model.safetensors").write_bytes(b"half written")
    keep = out / "unrelated"
    keep.mkdir()

    with client_for(settings) as c:
        m = c.get(f"/v1/merges/{crashed}").json()
        assert m["status"] == "failed" and "server stopped" in m["error"]
        assert not stage.exists() and not (out / "crashed").exists() and keep.is_dir()
        h = c.get("/v1/models/half").json()
        assert h["status"] == "failed" and "server stopped" in h["error"]
        assert c.get(f"/v1/ingestions/{half}").json()["status"] == "failed"
        assert wait(c, "/v1/models/later")["status"] == "ready"
        assert wait(c, f"/v1/ingestions/{later}")["status"] == "succeeded"
        r = wait(c, f"/v1/merges/{resumed}")
        assert r["status"] == "succeeded", r
        assert (out / "resumed" / "manifest.json").is_file()
        # a failed name is free again
        again = c.post("/v1/models", json={"name": "half", "path": str(family["e0"]),
                                           "base": "base"})
        assert again.status_code == 202, again.text
        assert wait(c, "/v1/models/half")["status"] == "ready"


def test_stopping_leaves_queued_jobs_queued(tmp_path: Path) -> None:
    """A job the workers never took stays queued in the catalog across a stop."""
    from mergepipe.jobs.runner import JobRunner

    family = make_family(tmp_path / "data" / "family")
    settings = settings_for(tmp_path)
    with Catalog(settings.catalog) as cat:
        runner = JobRunner(cat, settings)
        runner.stop(grace_s=1)  # stopped before it ever started
        job = enqueue(cat, ingests=[NewIngestJob("base", "full", str(family["base"]), None)]).ingest_ids[0]
        runner.submit(Job("ingest", job))
        assert queue.get_ingest_job(cat, job).status == "queued"  # type: ignore[union-attr]
    with client_for(settings) as c:
        assert wait(c, "/v1/models/base")["status"] == "ready"


def test_an_expert_queued_before_its_base_does_not_block_a_single_worker(
        tmp_path: Path) -> None:
    family = make_family(tmp_path / "data" / "family")
    settings = settings_for(tmp_path, workers=1)
    with Catalog(settings.catalog) as cat:
        enqueue(cat, ingests=[NewIngestJob("e0", "full", str(family["e0"]), "base")]).ingest_ids[0]
        enqueue(cat, ingests=[NewIngestJob("base", "full", str(family["base"]), None)]).ingest_ids[0]
    with client_for(settings) as c:
        assert wait(c, "/v1/models/e0", timeout=30)["status"] == "ready"
        assert c.get("/v1/models/base").json()["status"] == "ready"
