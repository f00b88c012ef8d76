"""A catalog that cannot be written (its file and folder made immutable with chattr +i while the
server runs; a PostgreSQL database set read-only) turns writes into 503 catalog_read_only with a
message saying what to do, not 500s; reads keep working."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mergepipe.catalog.connection import SQL
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import CatalogReadOnly
from tests import catalogs
from tests.api_helpers import client_for, make_family, settings_for


@contextlib.contextmanager
def immutable(d: Path) -> Iterator[None]:
    """chattr +i on every file of `d` and on `d` itself, for the block."""
    paths = [*sorted(d.iterdir()), d]
    done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["chattr", "-i", *map(str, paths)], capture_output=True)
        pytest.skip(f"cannot make files immutable here ({done.stderr.strip()[:200]})")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def test_writes_to_an_immutable_catalog_are_503_and_reads_work(tmp_path: Path) -> None:
    fam = make_family(tmp_path / "data")
    (tmp_path / "cat").mkdir()
    catalog = tmp_path / "cat" / "c.duckdb"
    with client_for(settings_for(tmp_path, catalog=catalog)) as c, immutable(catalog.parent):
        r = c.post("/v1/models", json={"name": "base", "path": str(fam["base"]),
                                       "kind": "full"})
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "catalog_read_only"
        assert str(catalog) in err["message"] and "Operation not permitted" in err["message"]
        assert "chattr -i" in err["message"] and "writable" in err["message"]
        r = c.get("/v1/models")
        assert r.status_code == 200 and r.json()["models"] == []


def test_opening_an_immutable_catalog_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    path = tmp_path / "cat" / "c.duckdb"
    Catalog(path).close()
    with immutable(path.parent), pytest.raises(CatalogReadOnly) as err:
        Catalog(path)
    assert err.value.status == 503 and "chattr -i" in err.value.message


def test_a_read_only_postgresql_catalog_is_503(tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg")
    url = catalogs.new_database()
    Catalog(url).close()  # migrated while writable
    with psycopg.connect(catalogs.admin_url(), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" '
                     "SET default_transaction_read_only = on")
    cat = Catalog(url)
    try:
        assert cat.query(SQL("SELECT count(*) FROM models"))[0][0] == 0  # reads work
        with pytest.raises(CatalogReadOnly) as err:
            cat.execute(SQL("DELETE FROM models WHERE name = 'x'"))
        assert err.value.status == 503 and "MERGEPIPE_CATALOG" in err.value.message
    finally:
        cat.close()
