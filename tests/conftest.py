"""Shared fixtures: a fresh catalog and a small seeded family on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from tests import catalogs, factory
from tests.pg_server import create_database
from tests.remote_servers import moto_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not catalogs.ON_POSTGRES:
        return
    for item in items:
        mark = item.get_closest_marker("duckdb_only")
        if mark is not None:
            why = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
            item.add_marker(pytest.mark.skip(reason=f"DuckDB-only: {why}"))


def pytest_sessionfinish() -> None:
    catalogs.stop_server()


@pytest.fixture
def catalog(tmp_path: Path):
    """A fresh catalog (a DuckDB file, or a PostgreSQL database under `make test-pg`)."""
    cat = Catalog(catalogs.new_catalog(tmp_path))
    yield cat
    cat.close()


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory):
    """An empty catalog shared by a module's tests (the mergekit parity modules ingest their
    family into it); modules that need another one define their own `cat`."""
    c = Catalog(catalogs.new_catalog(tmp_path_factory.mktemp("cat")))
    yield c
    c.close()


@pytest.fixture
def family(tmp_path: Path) -> dict[str, Path]:
    """A bf16 base and three full experts (one with an untouched tensor)."""
    root = tmp_path / "family"
    base = factory.make_base(root / "base", seed=0)
    out = {"base": base}
    for i in range(3):
        out[f"e{i}"] = factory.make_expert(
            base, root / f"e{i}", seed=100 + i,
            zero_tensors=("model.norm.weight",) if i == 0 else ())
    return out


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on loopback, started once for the session (its endpoint URL)."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def postgres_admin_url():
    """A real PostgreSQL server from the machine's binaries, started once for the session
    (the one the catalogs of `make test-pg` live on)."""
    return catalogs.admin_url()


@pytest.fixture
def postgres_url(postgres_admin_url: str, request: pytest.FixtureRequest) -> str:
    """A fresh empty database on the session's PostgreSQL server (its postgresql:// URL)."""
    return create_database(postgres_admin_url, f"t{abs(hash(request.node.nodeid)):x}")


@pytest.fixture(scope="session")
def ray_runtime(tmp_path_factory: pytest.TempPathFactory):
    """A real local Ray runtime (2 worker CPUs), started once for the session; yields the
    directory of its fault hook (tests.ray_runtime)."""
    from tests.ray_runtime import local_ray

    with local_ray(tmp_path_factory.mktemp("ray-hold")) as hold:
        yield hold
