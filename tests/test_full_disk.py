"""A full output disk is a 507 with a message a user can act on: refused when the merge is
accepted if the output root has no room, and a merge whose disk fills up while it writes fails
with the same error, publishing nothing. The disk is a small tmpfs mounted by the test (root
only: skipped elsewhere); a file-size limit (RLIMIT_FSIZE, in a child) needs no root."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import find_model
from mergepipe.core.errors import InsufficientStorage
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import run_merge, submit_merge
from tests.api_helpers import (
    client_for,
    make_family,
    register_family,
    settings_for,
    ties_body,
)
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

KIB = 1 << 10


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()[:200]})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(d: Path) -> None:
    """Write into `d` until its file system is full."""
    with open(d / "filler", "wb") as f:
        chunk = b"\xff" * (64 * KIB)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC


def test_a_merge_into_a_full_output_root_is_a_507(tmp_path: Path) -> None:
    fam = make_family(tmp_path / "data")
    with tmpfs(tmp_path / "outputs", 64 * KIB):
        with client_for(settings_for(tmp_path)) as c:
            register_family(c, fam)
            r = c.post("/v1/merges", json=ties_body("full"))
        assert r.status_code == 507, r.text
        err = r.json()["error"]
        assert err["code"] == "insufficient_storage" and err["field"] == "output"
        assert "not enough disk space" in err["message"]
        assert str(tmp_path / "outputs") in err["message"]
        assert "MERGEPIPE_OUTPUT_ROOT" in err["message"]
        assert os.listdir(tmp_path / "outputs") == []


def test_a_disk_that_fills_while_the_merge_writes_fails_it_with_a_507(tmp_path: Path) -> None:
    cat = Catalog(new_catalog(tmp_path))
    try:
        ingest_family(cat, tmp_path / "fam")
        req = build_request(base="base", experts="e0,e1", operator="linear", budget=1.0)
        with tmpfs(tmp_path / "outputs", 4096 * KIB) as root:
            merge_id = submit_merge(cat, req, "late", root / "late").merge_id
            assert merge_id is not None
            _fill(root)  # another writer filled the disk after the merge was accepted
            with pytest.raises(InsufficientStorage) as err:
                run_merge(cat, merge_id)
            assert err.value.status == 507
            assert "the output disk is full" in err.value.message
            assert "nothing was published" in err.value.message
            assert sorted(os.listdir(root)) == ["filler"]  # no output, no staging left
            row = records.get_merge(cat, merge_id)
            assert row.status == "failed" and "the output disk is full" in (row.error or "")
            assert find_model(cat, "late") is None
    finally:
        cat.close()


CHILD = """
import resource, signal, sys
from pathlib import Path
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import MergePipeError
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import execute_plan
from mergepipe.planner.plan import make_plan
cat = Catalog(sys.argv[1])
plan = make_plan(cat, build_request(base="base", experts="e0,e1", operator="linear", budget=1.0))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, not a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, resource.RLIM_INFINITY))
try:
    execute_plan(cat, plan, Path(sys.argv[2]))
    print("published")
except MergePipeError as e:
    print(e.status, e.code, e.message)
"""


def test_a_file_size_limit_hit_while_writing_is_a_507(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "c.duckdb")  # a DuckDB file: the child only reads it
    try:
        ingest_family(cat, tmp_path / "fam")
    finally:
        cat.close()
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "c.duckdb"),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("507 insufficient_storage an output file is over the file-size "
                           "limit: File too large while writing the output under"), line
    assert "nothing was published" in line and "MERGEPIPE_OUTPUT_ROOT" in line
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
