"""Model lifecycle (docs/lifecycle.md): versions, re-verification of touched files, removal,
cancelling and retiring merges, and `merge --overwrite` replacing the output's model. On the
CLI, through the in-process API, and on PostgreSQL under `make test-pg`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog import leases, records
from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.fence import Fence, MergeCancelled
from mergepipe.cli.main import main
from mergepipe.core.progress import Progress
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import submit_merge
from tests import factory
from tests.api_helpers import client_for, make_family, register_family, settings_for, wait
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family
from tests.site_hooks.hold_hooks import holding


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A catalog with base, e0..e2 ingested; the CLI's output root under tmp_path."""
    db = new_catalog(tmp_path)
    with Catalog(db) as cat:
        paths = ingest_family(cat, tmp_path / "fam")
    monkeypatch.setenv("MERGEPIPE_OUTPUT_ROOT", str(tmp_path / "outputs"))
    return {"db": str(db), "paths": paths, "tmp": tmp_path}


def cli(env: dict[str, Any], *args: str) -> int:
    return main(["--catalog", env["db"], *args])


def rows(env: dict[str, Any], sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with Catalog(env["db"]) as cat:
        return [tuple(r) for r in cat.query(SQL(sql), params)]


def shard(path: Path) -> Path:
    return next(path.glob("*.safetensors"))


def touch(path: Path) -> None:
    """New mtime, same bytes (what `touch` or a copy that keeps the content does)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))


def merge_cli(env: dict[str, Any], out: str, *extra: str, experts: str = "e0,e1") -> int:
    return cli(env, "merge", "--base", "base", "--experts", experts, "--op", "linear",
               "--strategy", "scratch", "--out", str(env["tmp"] / "outputs" / out), *extra)


# -- versions and re-verification ----------------------------------------------------------------

def test_a_touched_file_is_reverified_by_hash_and_accepted(env: dict[str, Any],
                                                           capsys: pytest.CaptureFixture) -> None:
    f = shard(env["paths"]["e0"])
    touch(f)
    assert merge_cli(env, "t1") == 0, capsys.readouterr().err
    (mtime,) = rows(env, "SELECT mtime_ns FROM files WHERE model = 'e0'")[0]
    assert mtime == f.stat().st_mtime_ns  # the new stamp is recorded: no re-hash next time
    capsys.readouterr()
    touch(f)
    assert cli(env, "ingest", str(env["paths"]["e0"]), "--name", "e0", "--base", "base",
               "--json") == 0
    m = json.loads(capsys.readouterr().out)
    assert (m["name"], m["version"]) == ("e0", 1)  # the same content: the same version
    assert rows(env, "SELECT count(*) FROM models WHERE family = 'e0'") == [(1,)]
    assert rows(env, "SELECT mtime_ns FROM files WHERE model = 'e0'") == [(f.stat().st_mtime_ns,)]


def test_a_touched_lora_adapter_is_reverified_including_lora_a(
        env: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    adapter = factory.make_lora(env["paths"]["base"], env["tmp"] / "lora", seed=5)
    assert cli(env, "ingest", str(adapter), "--name", "l0", "--base", "base", "--kind",
               "lora") == 0
    f = adapter / "adapter_model.safetensors"
    touch(f)
    assert merge_cli(env, "lm", experts="l0,e1") == 0, capsys.readouterr().err
    capsys.readouterr()
    # Other lora_A bytes (lora_B's blocks unchanged), mtime changed: refused, naming lora_A.
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(f))
    name = next(n for n in tensors if ".lora_A." in n)
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(f))
    assert merge_cli(env, "lm2", experts="l0,e1") == 2
    err = capsys.readouterr().err
    assert "model 'l0'" in err and "lora_A" in err and "re-ingest 'l0'" in err


def test_changed_bytes_refuse_the_merge_and_reingesting_makes_a_version(
        env: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    assert merge_cli(env, "before") == 0
    capsys.readouterr()
    factory.make_expert(env["paths"]["base"], env["paths"]["e0"], seed=4242)  # new bytes
    assert merge_cli(env, "refused") == 2
    err = capsys.readouterr().err
    assert "model 'e0'" in err and str(shard(env["paths"]["e0"])) in err
    assert "re-ingest 'e0'" in err and err.count("\n") == 1
    assert cli(env, "ingest", str(env["paths"]["e0"]), "--name", "e0", "--base", "base") == 0
    assert "registered 'e0~2'" in capsys.readouterr().out
    assert merge_cli(env, "after", "--json") == 0
    merge_id = json.loads(capsys.readouterr().out)["merge_id"]
    # The merge, its experts and its lineage name the exact version read.
    assert rows(env, "SELECT model FROM merge_experts WHERE merge_id = :m ORDER BY position",
                m=merge_id) == [("e0~2",), ("e1",)]
    assert ("e0~2", "expert") in rows(env, "SELECT parent, role FROM lineage WHERE merge_id = :m",
                                      m=merge_id)
    with Catalog(env["db"]) as cat:
        req = records.get_merge(cat, merge_id).request
    assert [e["model"] for e in req["experts"]] == ["e0~2", "e1"]
    manifest = json.loads((env["tmp"] / "outputs" / "after" / "manifest.json").read_text())
    assert [e["model"] for e in manifest["request"]["experts"]] == ["e0~2", "e1"]
    # Version 1 is still there, pinned by name~1, and the listing shows the latest version.
    assert cli(env, "models", "--json") == 0
    listed = {m["family"]: m for m in json.loads(capsys.readouterr().out)}
    assert listed["e0"]["version"] == 2 and listed["e0"]["name"] == "e0~2"
    assert cli(env, "plan", "--base", "base", "--experts", "e0~1,e1", "--op", "linear",
               "--strategy", "scratch", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert [e["model"] for e in plan["experts"]] == ["e0", "e1"]
    # Removing one version leaves the others.
    assert cli(env, "rm", "e0~1", "--force") == 0
    assert "retired 'e0'" in capsys.readouterr().out
    assert rows(env, "SELECT name FROM models WHERE family = 'e0' AND retired_at IS NULL"
                ) == [("e0~2",)]


def test_replay_reads_the_version_a_merge_read(env: dict[str, Any],
                                               capsys: pytest.CaptureFixture) -> None:
    assert merge_cli(env, "v1", "--json") == 0
    first = json.loads(capsys.readouterr().out)
    retrained = factory.make_expert(env["paths"]["base"], env["tmp"] / "retrained", seed=31)
    assert cli(env, "ingest", str(retrained), "--name", "e0", "--base", "base") == 0
    assert "registered 'e0~2'" in capsys.readouterr().out
    assert merge_cli(env, "v2", "--json") == 0
    second = json.loads(capsys.readouterr().out)
    assert second["output_hash"] != first["output_hash"]  # the name now means version 2
    assert cli(env, "replay", first["merge_id"], "--json") == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["match"] is True and not replayed["mismatched_tensors"]


# -- removal --------------------------------------------------------------------------------------

def test_rm_refuses_while_used_then_force_retires(env: dict[str, Any],
                                                  capsys: pytest.CaptureFixture) -> None:
    assert merge_cli(env, "m1") == 0
    capsys.readouterr()
    assert cli(env, "rm", "e1") == 2
    err = capsys.readouterr().err
    assert "in use" in err and "merge output 'm1'" in err and err.count("\n") == 1
    assert cli(env, "rm", "base") == 2
    assert "expert 'e0'" in capsys.readouterr().err
    assert cli(env, "rm", "e1", "--force") == 0
    assert "retired 'e1'" in capsys.readouterr().out
    assert cli(env, "models", "--json") == 0
    assert "e1" not in {m["family"] for m in json.loads(capsys.readouterr().out)}
    # Rows and lineage stay, visible in SQL.
    assert rows(env, "SELECT retired_at IS NOT NULL FROM models WHERE name = 'e1'") == [(True,)]
    assert rows(env, "SELECT count(*) FROM lineage WHERE parent = 'e1'") == [(1,)]
    assert merge_cli(env, "m2") == 2  # a retired model is not merged
    assert "'e1' was removed" in capsys.readouterr().err
    # The name can be ingested again: a new version.
    assert cli(env, "ingest", str(env["paths"]["e1"]), "--name", "e1", "--base", "base") == 0
    assert "registered 'e1~2'" in capsys.readouterr().out
    assert merge_cli(env, "m2") == 0


def test_rm_deletes_only_merge_outputs_under_the_output_root(
        env: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    assert merge_cli(env, "gone") == 0
    out = env["tmp"] / "outputs" / "gone"
    assert out.is_dir()
    assert cli(env, "rm", "gone", "--delete-files") == 0
    assert not out.exists() and f"deleted {out}" in capsys.readouterr().out
    assert cli(env, "rm", "e2", "--force", "--delete-files") == 0
    assert "kept" in capsys.readouterr().out and env["paths"]["e2"].is_dir()
    elsewhere = env["tmp"] / "elsewhere"
    assert cli(env, "merge", "--base", "base", "--experts", "e0", "--op", "linear",
               "--out", str(elsewhere)) == 0
    assert cli(env, "rm", "elsewhere", "--delete-files") == 0
    assert "not under the output root" in capsys.readouterr().out and elsewhere.is_dir()


def test_merge_overwrite_replaces_the_output_model(env: dict[str, Any],
                                                   capsys: pytest.CaptureFixture) -> None:
    assert merge_cli(env, "ov") == 0
    assert merge_cli(env, "ov", experts="e0,e2") == 2
    assert "--overwrite" in capsys.readouterr().err
    assert merge_cli(env, "ov", "--overwrite", experts="e0,e2") == 0
    live = rows(env, "SELECT name, version FROM models WHERE family = 'ov' AND retired_at IS NULL")
    assert live == [("ov~2", 2)]
    assert rows(env, "SELECT retired_at IS NOT NULL FROM models WHERE name = 'ov'") == [(True,)]
    # Another name over the same directory retires the model that pointed at it.
    assert merge_cli(env, "ov", "--overwrite", "--name", "other") == 0
    assert rows(env, "SELECT count(*) FROM models WHERE path LIKE '%/ov' AND retired_at IS NULL"
                ) == [(1,)]
    assert rows(env, "SELECT family FROM models WHERE path LIKE '%/ov' AND retired_at IS NULL"
                ) == [("other",)]


def test_rm_merge_retires_a_finished_merge(env: dict[str, Any],
                                           capsys: pytest.CaptureFixture) -> None:
    assert merge_cli(env, "r1", "--json") == 0
    merge_id = json.loads(capsys.readouterr().out)["merge_id"]
    assert cli(env, "rm", "--merge", merge_id) == 0
    assert f"merge {merge_id}: retired" in capsys.readouterr().out
    assert rows(env, "SELECT status, retired_at IS NOT NULL FROM merges WHERE merge_id = :m",
                m=merge_id) == [("succeeded", True)]
    with Catalog(env["db"]) as cat:
        assert merge_id not in {m.merge_id for m in records.list_merges(cat, 100, 0)}


def test_a_cancelled_merge_stops_at_its_next_progress_report(tmp_path: Path) -> None:
    with Catalog(new_catalog(tmp_path)) as cat:
        ingest_family(cat, tmp_path / "fam")
        req = build_request(base="base", experts=[{"model": "e0"}], operator="linear")
        merge_id = submit_merge(cat, req, "c1", tmp_path / "c1").merge_id
        assert merge_id is not None
        records.mark_running(cat, merge_id)
        records.record_progress(cat, merge_id, Progress(1, 9, "blocks"))
        assert records.cancel_merge(cat, merge_id)
        with pytest.raises(MergeCancelled):
            records.record_progress(cat, merge_id, Progress(2, 9, "blocks"))
        assert records.get_merge(cat, merge_id).status == "cancelled"
        assert not records.cancel_merge(cat, merge_id)  # ended already


# -- the API --------------------------------------------------------------------------------------

@pytest.fixture
def api(tmp_path: Path) -> Any:
    family = make_family(tmp_path / "data" / "family")
    with client_for(settings_for(tmp_path, workers=1)) as c:
        register_family(c, family)
        yield c, family, tmp_path


def _merge(c: Any, name: str, experts: list[str]) -> str:
    r = c.post("/v1/merges", json={"base": "base", "experts": [{"model": e} for e in experts],
                                   "operator": "linear", "strategy": "scratch",
                                   "output": {"name": name}})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_api_delete_model_409_then_forced(api: Any) -> None:
    c, _, _ = api
    mid = _merge(c, "a1", ["e0", "e1"])
    assert wait(c, f"/v1/merges/{mid}")["status"] == "succeeded"
    r = c.delete("/v1/models/e1")
    assert r.status_code == 409, r.text
    assert "a1" in r.json()["error"]["message"]
    r = c.delete("/v1/models/e1", params={"force": "true"})
    assert r.status_code == 200 and r.json()["retired"] == ["e1"], r.text
    assert "e1" not in {m["name"] for m in c.get("/v1/models").json()["models"]}
    one = c.get("/v1/models/e1").json()
    assert one["retired_at"] is not None  # still there, by its key
    assert c.delete("/v1/models/nope").status_code == 404
    r = c.post("/v1/sql", json={"sql": "SELECT name FROM models WHERE retired_at IS NOT NULL"})
    assert r.status_code == 200 and ["e1"] in r.json()["rows"], r.text


def test_api_reingest_with_new_content_makes_a_version(api: Any) -> None:
    c, family, _ = api
    factory.make_expert(family["base"], family["e2"], seed=777)
    r = c.post("/v1/models", json={"name": "e2", "path": str(family["e2"]), "base": "base"})
    assert r.status_code == 202, r.text
    job = wait(c, f"/v1/ingestions/{r.json()['id']}")
    assert job["status"] == "succeeded", job
    m = c.get("/v1/models/e2").json()
    assert (m["name"], m["version"]) == ("e2~2", 2)
    assert c.get("/v1/models/e2~1").json()["name"] == "e2"


def test_api_cancel_a_running_merge_publishes_nothing(api: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    c, _, tmp = api
    hold = tmp / "hold"
    hold.mkdir()
    (hold / "hold").touch()
    with holding(hold, "merge_staged"):  # the merge waits at its hold while the file exists
        mid = _merge(c, "held", ["e0", "e1"])
        deadline = time.monotonic() + 60
        while not (hold / "pid").exists():
            assert time.monotonic() < deadline, "the merge never reached its hold"
            time.sleep(0.05)
        r = c.delete("/v1/models/e1")  # a running merge reads it
        assert r.status_code == 409 and f"running merge '{mid}'" in r.json()["error"]["message"]
        # A queued merge (the one worker is busy) is cancelled before it runs.
        queued = _merge(c, "held2", ["e0"])
        assert c.delete(f"/v1/merges/{queued}").json()["status"] == "cancelled"
        r = c.delete(f"/v1/merges/{mid}")
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
        (hold / "hold").unlink()
        outputs = tmp / "outputs"
        while any(p.name.startswith(".held.tmp") for p in outputs.iterdir()):
            assert time.monotonic() < deadline, "the cancelled run never ended"
            time.sleep(0.05)
        again = _merge(c, "held2", ["e0"])  # the cancelled merge's output name is free again
        assert wait(c, f"/v1/merges/{again}")["status"] == "succeeded"
        assert c.get(f"/v1/merges/{mid}").json()["status"] == "cancelled"
        assert c.get(f"/v1/merges/{queued}").json()["status"] == "cancelled"
        assert not (outputs / "held").exists()
        assert c.get("/v1/models/held").status_code == 404
        # A finished merge is retired: it leaves the listing.
        r = c.delete(f"/v1/merges/{mid}")
        assert r.status_code == 200 and r.json()["retired_at"] is not None
        assert mid not in {m["id"] for m in c.get("/v1/merges").json()["merges"]}


def test_a_worker_on_a_shared_catalog_sees_the_cancel(tmp_path: Path, postgres_url: str) -> None:
    """A merge held under a worker's lease (the PostgreSQL queue): cancelled by another
    process's request, its next fenced write is refused as cancelled, and no worker claims it."""
    with Catalog(postgres_url) as cat:
        ingest_family(cat, tmp_path / "fam")
        req = build_request(base="base", experts=[{"model": "e0"}], operator="linear")
        merge_id = submit_merge(cat, req, "w1", tmp_path / "w1").merge_id
        got = leases.claim(cat, "A", lease_s=30)
        assert got is not None and got.job.id == merge_id
        fence = Fence("A", "aaaaaa")
        records.mark_running(cat, merge_id, fence)
        records.record_progress(cat, merge_id, Progress(1, 9, "blocks"), fence)
        assert records.cancel_merge(cat, merge_id)
        with pytest.raises(MergeCancelled, match="cancelled"):
            records.record_progress(cat, merge_id, Progress(2, 9, "blocks"), fence)
        assert leases.claim(cat, "B", lease_s=30) is None
        assert records.get_merge(cat, merge_id).status == "cancelled"
