"""A loop of symbolic links under a data root is refused with its true reason (a loop), not as a
path "outside the data root" or one that "does not exist": when the path is accepted, when a
confined job opens it (both resolvers), and in an ingestion job's error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import NewIngestJob
from mergepipe.core.errors import InvalidRequest
from mergepipe.jobs.ingest import run_ingestion
from mergepipe.storage import fsconfine
from mergepipe.storage.fsconfine import open_confined
from mergepipe.storage.paths import confine_input
from tests import factory
from tests.catalogs import new_catalog


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(fsconfine, "FORCE_WALK", request.param == "walk")
    yield request.param


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    (root / "self").symlink_to("self")
    return root


def test_a_loop_is_named_when_the_path_is_accepted(root: Path) -> None:
    for name in ("a", "self"):
        with pytest.raises(InvalidRequest, match="is a loop of symbolic links"):
            confine_input(str(root / name), [root])
    with pytest.raises(InvalidRequest, match="does not exist"):
        confine_input(str(root / "missing"), [root])


def test_a_loop_is_named_when_a_confined_job_opens_it(root: Path, mode: str) -> None:
    for name in ("a", "self"):
        with pytest.raises(InvalidRequest, match="a loop of symbolic links") as err:
            os.close(open_confined(str(root / name), os.O_RDONLY, [str(root)]))
        assert "outside" not in err.value.message and str(root / name) in err.value.message


def test_an_ingestion_of_a_directory_holding_a_loop_says_so(root: Path, tmp_path: Path,
                                                            mode: str) -> None:
    ckpt = factory.make_base(root / "ckpt")
    (ckpt / "tokenizer.json").symlink_to("tokenizer.json.lnk")
    (ckpt / "tokenizer.json.lnk").symlink_to("tokenizer.json")
    cat = Catalog(new_catalog(tmp_path))
    try:
        with pytest.raises(InvalidRequest, match="a loop of symbolic links") as err:
            run_ingestion(cat, NewIngestJob("b", "full", str(ckpt), None), data_roots=[root])
        assert "outside" not in err.value.message and "tokenizer.json" in err.value.message
    finally:
        cat.close()
