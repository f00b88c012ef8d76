"""Confinement at the moment of every open (issue 11): files inside a data root are opened
beneath the root's descriptor, so that a symbolic link swapped in at any moment (while a job is
queued, between the job's re-check and its reads, during a merge before the side files are
copied) is refused and no byte from outside is read. The swaps are made by hooks (a job queued
while no worker runs, a merge's progress callback), never by sleeping."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog import queue
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import find_model
from mergepipe.catalog.queue import NewIngestJob, NewMerge, enqueue
from mergepipe.core.errors import Forbidden, MergePipeError
from mergepipe.core.progress import Progress
from mergepipe.core.request import build_request
from mergepipe.jobs.ingest import run_ingest_job
from mergepipe.jobs.merge import run_merge
from mergepipe.storage import fsconfine
from mergepipe.storage.fsconfine import confined, open_confined
from mergepipe.storage.storage import open_reader
from mergepipe.storage.store import store_for
from tests import factory
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

SECRET = "outside-secret-7f3a"


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both resolvers: the kernel's openat2 and the O_NOFOLLOW walk used where it is missing."""
    monkeypatch.setattr(fsconfine, "FORCE_WALK", request.param == "walk")
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root, outside, other = tmp_path / "root", tmp_path / "outside", tmp_path / "other-root"
    (root / "d" / "sub").mkdir(parents=True)
    outside.mkdir()
    other.mkdir()
    (root / "d" / "sub" / "f").write_text("inside")
    (outside / "f").write_text(SECRET)
    (other / "f").write_text("other root")
    (root / "d" / "in-link").symlink_to("sub/f")  # stays inside: followed
    (root / "d" / "abs-out").symlink_to(outside / "f")
    (root / "d" / "rel-out").symlink_to("../../outside/f")
    (root / "d" / "dir-out").symlink_to(outside, target_is_directory=True)
    (root / "d" / "to-other").symlink_to(other / "f")
    (root / "d" / "up").symlink_to("../..", target_is_directory=True)
    return {"root": root, "outside": outside, "other": other}


def _read(path: Path, roots: list[str]) -> str:
    fd = open_confined(str(path), os.O_RDONLY, roots)
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def test_links_out_of_the_root_are_refused_at_open(tree: dict[str, Path], mode: str) -> None:
    roots = [str(tree["root"]), str(tree["other"])]
    d = tree["root"] / "d"
    assert _read(d / "sub" / "f", roots) == "inside"
    assert _read(d / "in-link", roots) == "inside"
    assert _read(d / "to-other", roots) == "other root"  # a link into another root
    for bad in ("abs-out", "rel-out", "dir-out/f", "up/outside/f"):
        with pytest.raises(Forbidden, match="outside the data root"):
            _read(d / bad, roots)
    # not confined (the CLI) or outside every root: opened as before
    assert _read(d / "abs-out", []) == SECRET
    assert _read(tree["outside"] / "f", roots) == SECRET


def test_a_directory_swapped_for_a_link_is_refused(tree: dict[str, Path], mode: str) -> None:
    roots = [str(tree["root"])]
    d = tree["root"] / "d"
    assert _read(d / "sub" / "f", roots) == "inside"
    shutil.rmtree(d / "sub")
    (d / "sub").symlink_to(tree["outside"], target_is_directory=True)
    with pytest.raises(Forbidden):
        _read(d / "sub" / "f", roots)


def test_the_reader_and_the_store_refuse_a_file_swapped_after_the_first_read(
        tree: dict[str, Path], mode: str) -> None:
    """The range reader and the store seam open beneath the root of the job they were made in."""
    d = tree["root"] / "d"
    (d / "g").write_text("inside too")
    with confined([tree["root"]]):
        reader, store = open_reader(), store_for(str(d))
    with reader:
        assert bytes(reader.read(str(d / "sub" / "f"), 0, 6)) == b"inside"
        (d / "g").unlink()
        (d / "g").symlink_to(tree["outside"] / "f")  # swapped between two reads of the job
        with pytest.raises(Forbidden):
            reader.read(str(d / "g"), 0, 6)
    with pytest.raises(Forbidden):
        store.read_bytes(str(d / "g"), 1000)
    with pytest.raises(Forbidden):
        store.entries(str(d))  # the listing names the link out, and refuses it
    assert store.entries(str(d / "sub")) == {"f": "file"}


def test_a_queued_ingestion_whose_directory_became_a_link_out_is_refused(
        tmp_path: Path, mode: str) -> None:
    """Accepted while inside the root, swapped for a link to an outside checkpoint while queued:
    on 0.1 the re-check skipped it (its real path was outside every root) and it was ingested."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    base = factory.make_base(data / "ckpt", seed=0)
    factory.make_base(outside / "ckpt", seed=9)
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        job_id = enqueue(cat, ingests=[NewIngestJob("m", "full", str(base), None)]).ingest_ids[0]
        shutil.rmtree(base)
        base.symlink_to(outside / "ckpt", target_is_directory=True)
        run_ingest_job(cat, job_id, data_roots=[data.resolve()])
        row = queue.get_ingest_job(cat, job_id)
        assert row is not None and row.status == "failed", row
        assert "outside" in (row.error or ""), row.error
        assert find_model(cat, "m") is None


def _queue_merge(cat: Catalog, out: Path, base: str = "base") -> str:
    req = build_request(base=base, experts=[{"model": "e0"}, {"model": "e1"}],
                        operator="task_arithmetic", budget={"fraction": 1.0})
    merge_id = enqueue(cat, merge=NewMerge(req, out.name, str(out))).merge_id
    assert merge_id is not None
    return merge_id


def test_a_config_swapped_for_a_link_during_the_merge_is_not_copied(
        tmp_path: Path, mode: str) -> None:
    """The base's config.json swapped for a link out after the merge's re-check (from its
    progress callback, while blocks stream): on 0.1 the side-file copy followed it and published
    the outside file in the output."""
    data, outside = (tmp_path / "data").resolve(), tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"secret": SECRET}))
    out_root = (tmp_path / "outputs").resolve()
    out_root.mkdir()
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        paths = ingest_family(cat, data, kinds=("full", "full"))
        merge_id = _queue_merge(cat, out_root / "swapped")
        swapped: list[bool] = []

        def swap(p: Progress) -> None:
            if not swapped:
                cfg = paths["base"] / "config.json"
                cfg.unlink()
                cfg.symlink_to(outside / "secret.json")
                swapped.append(True)

        with pytest.raises(MergePipeError, match="outside the data root"):
            run_merge(cat, merge_id, progress=swap, data_roots=[data], output_root=out_root)
        assert swapped
        for f in tmp_path.rglob("*"):
            if f.is_file() and not f.is_symlink() and outside not in f.parents:
                assert SECRET.encode() not in f.read_bytes(), f
        assert not (out_root / "swapped").exists()


def test_a_merge_reads_earlier_outputs_beneath_the_output_root(tmp_path: Path) -> None:
    """Confined merges still read inputs under the output root and links inside a root."""
    data, out_root = (tmp_path / "data").resolve(), (tmp_path / "outputs").resolve()
    out_root.mkdir()
    with Catalog(new_catalog(tmp_path, "c")) as cat:
        ingest_family(cat, data, kinds=("full", "full"))
        first = run_merge(cat, _queue_merge(cat, out_root / "first"), data_roots=[data],
                          output_root=out_root)
        assert (out_root / "first" / "config.json").is_file()
        req = build_request(base="base", experts=[{"model": "first"}, {"model": "e1"}],
                            operator="task_arithmetic", budget={"fraction": 1.0})
        merge_id = enqueue(cat, merge=NewMerge(req, "second", str(out_root / "second"))).merge_id
        assert merge_id is not None
        second = run_merge(cat, merge_id, data_roots=[data], output_root=out_root)
        assert first.output_hash != second.output_hash
