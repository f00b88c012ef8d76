"""SIGKILL `python -m mergepipe ingest` and `mergepipe merge` at many points (observed in /proc
and on disk, then after increasing delays): the catalog opens, a model is all there or not at
all, no partial output is visible, the next merge cleans what the dead one left and marks it
failed, and reruns give byte-identical outputs with the same hashes."""

from __future__ import annotations

import functools
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog
from mergepipe.cli.main import main
from tests import factory
from tests.catalogs import new_catalog
from tests.crash_helpers import (
    Cli,
    block_fingerprint,
    has_open,
    kill_when,
    merge_rows,
    model_rows,
    timed,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")

SHAPES: dict[str, tuple[int, ...]] = {f"model.layers.{i}.mlp.{p}.weight": (1024, 1024)
                                      for i in range(6) for p in ("up_proj", "down_proj")}
SMALL: dict[str, tuple[int, ...]] = {f"model.layers.{i}.mlp.{p}.weight": (512, 256)
                                     for i in range(2) for p in ("up_proj", "down_proj")}
MERGE = ("--base", "base", "--experts", "e0,e1,e2", "--op", "ties", "--param", "density=0.5",
         "--budget", "0.9", "--seed", "5")


def make_family(root: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    base = factory.make_base(root / "base", seed=0, shapes=shapes)
    for i in range(3):
        factory.make_expert(base, root / f"e{i}", seed=10 + i)
    return root


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 MiB per checkpoint: a merge runs long enough to be killed at many points."""
    return make_family(tmp_path_factory.mktemp("crash-family"), SHAPES)


@pytest.fixture(scope="module")
def small_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family(tmp_path_factory.mktemp("crash-small"), SMALL)


def ingest_family(db: Path | str, family: Path) -> None:
    """In process: the catalog the merges start from."""
    assert main(["--catalog", str(db), "ingest", str(family / "base"), "--name", "base",
                 "--json"]) == 0
    for i in range(3):
        assert main(["--catalog", str(db), "ingest", str(family / f"e{i}"), "--name", f"e{i}",
                     "--base", "base", "--json"]) == 0


def merge_in_process(db: Path | str, out: Path, capsys: pytest.CaptureFixture[str]
                     ) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["--catalog", str(db), "merge", *MERGE, "--out", str(out), "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def leftovers(out_root: Path) -> list[str]:
    return sorted(p.name for p in out_root.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def check_output_is_whole_or_absent(target: Path, reference: Path) -> None:
    """Never a partial output: absent, or every file complete (published, maybe unrecorded)."""
    if not target.exists():
        return
    for f in reference.iterdir():
        assert (target / f.name).is_file(), f"partial output {target}: no {f.name}"
        if f.name.endswith(".safetensors"):
            assert (target / f.name).stat().st_size == f.stat().st_size


def prepare(tmp_path: Path, family: Path, capsys: pytest.CaptureFixture[str]
            ) -> dict[str, Any]:
    """A catalog with the family ingested, and the reference output (merged in process)."""
    db = new_catalog(tmp_path)
    ingest_family(db, family)
    out = tmp_path / "outputs"
    out.mkdir()
    ref = merge_in_process(db, out / "reference", capsys)
    return {"db": db, "out": out, "ref": ref, "cli": Cli(db, tmp_path)}


@pytest.fixture
def ready(tmp_path: Path, small_family: Path, capsys: pytest.CaptureFixture[str]
          ) -> Iterator[dict[str, Any]]:
    yield prepare(tmp_path, small_family, capsys)


@pytest.fixture
def ready_big(tmp_path: Path, family: Path, capsys: pytest.CaptureFixture[str]
              ) -> Iterator[dict[str, Any]]:
    yield prepare(tmp_path, family, capsys)


def test_recovery_removes_staging_and_unrecorded_outputs(ready: dict[str, Any],
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """The states a kill leaves (built by hand): in the staging phase, between the publishing
    rename and the catalog record, and in the middle of replacing an existing output."""
    from mergepipe.core.request import build_request
    from mergepipe.jobs.merge import submit_merge

    db, out = ready["db"], ready["out"]
    reference = out / "reference"
    req = build_request(base="base", experts="e0,e1,e2", operator="ties",
                        params={"density": 0.5}, budget=0.9, seed=5)
    with Catalog(db) as cat:
        staged = submit_merge(cat, req, "staged", out / "staged").merge_id
        published = submit_merge(cat, req, "published", out / "published").merge_id
        replacing = submit_merge(cat, req, "replacing", out / "replacing").merge_id
        assert staged is not None and published is not None and replacing is not None
        for m in (staged, published, replacing):
            records.mark_running(cat, str(m))
    (out / f".staged.tmp-{staged[2:]}").mkdir()
    (out / f".staged.tmp-{staged[2:]}" / "model.safetensors").write_bytes(b"half")
    (out / "published").mkdir()
    for f in reference.iterdir():
        (out / "published" / f.name).write_bytes(f.read_bytes())
    doc = json.loads((reference / "manifest.json").read_text())
    (out / "published" / "manifest.json").write_text(json.dumps({**doc, "merge_id": published}))
    (out / f".replacing.old-{replacing[2:]}").mkdir()  # the user's previous output, set aside
    (out / f".replacing.old-{replacing[2:]}" / "keep.txt").write_text("previous")
    (out / "not-ours").mkdir()
    (out / "not-ours" / "manifest.json").write_text(json.dumps({"merge_id": "m-someoneelse"}))

    again = merge_in_process(db, out / "again", capsys)  # the next merge recovers
    assert leftovers(out) == []
    assert not (out / "published").exists() and not (out / "staged").exists()
    assert (out / "replacing" / "keep.txt").read_text() == "previous"
    assert (out / "not-ours").is_dir()
    rows = merge_rows(db)
    for m in (staged, published, replacing):
        assert rows[m]["status"] == "failed" and "stopped before it finished" in rows[m]["error"]
    assert model_rows(db, "published")["models"] == 0
    assert again["output_hash"] == ready["ref"]["output_hash"]
    assert merge_in_process(db, out / "published", capsys)["output_hash"] == again["output_hash"]


def test_sigkill_a_merge_while_it_writes(ready: dict[str, Any],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    db, out, cli = ready["db"], ready["out"], ready["cli"]
    target = out / "victim"
    proc = cli.spawn("merge", *MERGE, "--out", str(target))
    killed = kill_when(proc, lambda: any(
        p.name.startswith(".victim.tmp-") and (p / "model.safetensors").exists()
        for p in out.iterdir()))
    check_output_is_whole_or_absent(target, out / "reference")
    assert model_rows(db, "victim")["models"] == int(not killed)
    if killed:
        assert not target.exists()
        assert [r["status"] for r in merge_rows(db).values()
                if r["output_name"] == "victim"] == ["running"]
    print(f"killed while writing: {killed}")
    rerun = merge_in_process(db, out / "rerun", capsys)
    assert leftovers(out) == []
    assert {r["status"] for r in merge_rows(db).values()} <= {"succeeded", "failed"}
    assert rerun["output_hash"] == ready["ref"]["output_hash"]
    assert ((out / "rerun" / "model.safetensors").read_bytes()
            == (out / "reference" / "model.safetensors").read_bytes())


@pytest.mark.slow
def test_sigkill_ingestion_at_many_points(tmp_path: Path, family: Path) -> None:
    db = new_catalog(tmp_path)
    cli = Cli(db, tmp_path)
    cli.run("ingest", str(family / "base"), "--name", "base")
    expert = str(family / "e0" / "model.safetensors")
    proc = cli.spawn("ingest", str(family / "e0"), "--name", "ref", "--base", "base")
    duration = timed(proc, lambda: has_open(proc.pid, expert))
    full = model_rows(db, "ref")
    assert all(n > 0 for n in full.values()), full
    reference = block_fingerprint(db, "ref")
    rng = random.Random(6)
    delays = [0.0] + [duration * f * rng.uniform(0.8, 1.2)
                      for f in (0.05, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0)]
    killed_at = []
    for k, delay in enumerate(delays):
        name = f"x{k}"
        proc = cli.spawn("ingest", str(family / "e0"), "--name", name, "--base", "base")
        if kill_when(proc, functools.partial(has_open, proc.pid, expert), delay):
            killed_at.append(round(delay, 3))
        rows = model_rows(db, name)  # the catalog opens, and the model is all there or absent
        assert rows in ({t: 0 for t in full}, full), (name, delay, rows)
        if rows == full:
            assert block_fingerprint(db, name) == reference
        else:  # the name is free: ingesting it again gives the same hashes and statistics
            assert main(["--catalog", str(db), "ingest", str(family / "e0"), "--name", name,
                         "--base", "base", "--json"]) == 0
            assert block_fingerprint(db, name) == reference
    print(f"ingestion killed at {killed_at} s after opening the expert ({duration:.2f} s run)")
    assert len(killed_at) >= 3


@pytest.mark.slow
def test_sigkill_merges_at_many_points(ready_big: dict[str, Any],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ready = ready_big
    db, out, cli = ready["db"], ready["out"], ready["cli"]
    reference = out / "reference"
    expert = str(Path(model_path(db, "e2")))
    proc = cli.spawn("merge", *MERGE, "--out", str(out / "timing"))
    duration = timed(proc, lambda: has_open(proc.pid, expert))

    def staged(name: str, file: str) -> bool:
        return any(p.name.startswith(f".{name}.tmp-") and (p / file).exists()
                   for p in out.iterdir())

    rng = random.Random(5)
    points: list[tuple[str, Any, float]] = [
        (f"delay-{f}", lambda p, n: has_open(p.pid, expert), duration * f * rng.uniform(0.8, 1.2))
        for f in (0.0, 0.2, 0.4, 0.6, 0.8, 0.95)]
    points += [
        ("staging", lambda p, n: staged(n, "."), 0.0),
        ("writing", lambda p, n: staged(n, "model.safetensors"), 0.0),
        ("manifest", lambda p, n: staged(n, "manifest.json"), 0.0),
        ("published", lambda p, n: (out / n).exists(), 0.0),
    ]
    killed: dict[str, str] = {}  # killed before its catalog record
    late: list[str] = []  # killed after it (while exiting: closing the catalog, ...)
    for label, trigger, delay in points:
        name = f"k-{label}"
        proc = cli.spawn("merge", *MERGE, "--out", str(out / name))
        was_killed = kill_when(proc, functools.partial(trigger, proc, name), delay)
        check_output_is_whole_or_absent(out / name, reference)
        (status,) = [r["status"] for r in merge_rows(db).values() if r["output_name"] == name]
        assert status in ("running", "succeeded"), status
        assert model_rows(db, name)["models"] == int(status == "succeeded")
        if status == "succeeded":
            assert (out / name / "manifest.json").is_file()
            if was_killed:
                late.append(label)
        else:
            assert was_killed
            killed[name] = label
    final = cli.run("merge", *MERGE, "--out", str(out / "final"))  # recovers, then merges
    assert leftovers(out) == []
    rows = {r["output_name"]: r for r in merge_rows(db).values()}
    for name in killed:
        assert rows[name]["status"] == "failed", rows[name]
        assert "stopped before it finished" in rows[name]["error"]
        assert not (out / name).exists() and model_rows(db, name)["models"] == 0
    for name in {f"k-{p[0]}" for p in points} - set(killed):
        assert rows[name]["status"] == "succeeded"
        assert ((out / name / "model.safetensors").read_bytes()
                == (reference / "model.safetensors").read_bytes())
    assert final["output_hash"] == ready["ref"]["output_hash"]
    for name in [*killed, "final"]:  # a killed name is free again; every rerun is identical
        if name != "final":
            assert merge_in_process(db, out / name, capsys)["output_hash"] == final["output_hash"]
        assert ((out / name / "model.safetensors").read_bytes()
                == (reference / "model.safetensors").read_bytes())
    print(f"merges killed at: {sorted(killed.values())}, after their record: {late} "
          f"({duration:.2f} s run)")
    assert len(killed) >= 5, killed


def model_path(db: Path, name: str) -> str:
    from mergepipe.catalog.connection import SQL

    with Catalog(db) as cat:
        return str(cat.query(SQL("SELECT path FROM files WHERE model = :n"),
                             {"n": name})[0][0])


@pytest.mark.duckdb_only("the sole server of a DuckDB catalog fails at its start the jobs it "
                         "was running; on a shared catalog they are taken over after their "
                         "lease instead (tests/test_shared_workers.py)")
def test_service_start_removes_an_output_published_but_not_recorded(
        ready: dict[str, Any]) -> None:
    """A server killed between the publishing rename and the catalog record: at its restart the
    merge is failed, its output gone and the name free."""
    from mergepipe.core.request import build_request
    from mergepipe.jobs.merge import submit_merge
    from tests.api_helpers import client_for, settings_for, ties_body, wait

    db, out = ready["db"], ready["out"]
    settings = settings_for(out.parent, catalog=db)
    assert settings.catalog == db and settings.output_root == out.resolve()
    req = build_request(base="base", experts="e0,e1,e2", operator="ties",
                        params={"density": 0.5}, budget=0.9, seed=5)
    with Catalog(db) as cat:
        mid = submit_merge(cat, req, "orphan", out / "orphan").merge_id
        records.mark_running(cat, str(mid))
    (out / "orphan").mkdir()
    (out / "orphan" / "model.safetensors").write_bytes(b"whole, but never recorded")
    (out / "orphan" / "manifest.json").write_text(json.dumps({"merge_id": mid}))
    (out.parent / "data").mkdir()
    with client_for(settings) as c:
        m = c.get(f"/v1/merges/{mid}").json()
        assert m["status"] == "failed" and "server stopped" in m["error"], m
        assert not (out / "orphan").exists() and leftovers(out) == []
        r = c.post("/v1/merges", json=ties_body("orphan", fraction=0.9, seed=5))
        assert r.status_code == 202, r.text
        assert wait(c, f"/v1/merges/{r.json()['id']}")["status"] == "succeeded"
