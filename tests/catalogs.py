"""Where the tests' catalogs live: DuckDB files by default, or, with
MERGEPIPE_TEST_CATALOG=postgresql (`make test-pg`), fresh databases on one real PostgreSQL server
started for the test session (tests.pg_server). Every test that makes a catalog asks here."""

from __future__ import annotations

import itertools
import os
import shutil
from contextlib import ExitStack
from pathlib import Path

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.dialect import is_postgres

BACKEND = os.environ.get("MERGEPIPE_TEST_CATALOG", "duckdb").strip().lower() or "duckdb"
if BACKEND not in ("duckdb", "postgresql"):
    raise RuntimeError(f"MERGEPIPE_TEST_CATALOG={BACKEND!r}: use duckdb or postgresql")
ON_POSTGRES = BACKEND == "postgresql"

_server = ExitStack()
_admin_url: list[str] = []
_names = itertools.count()


def admin_url() -> str:
    """The superuser URL of this process's PostgreSQL server, started on first use and stopped
    by `stop_server` at the end of the session."""
    if not _admin_url:
        from tests.pg_server import postgres_server

        _admin_url.append(_server.enter_context(postgres_server()))
    return _admin_url[0]


def stop_server() -> None:
    _server.close()
    _admin_url.clear()


def new_database() -> str:
    """A fresh empty database on the session's PostgreSQL server; its postgresql:// URL."""
    from tests.pg_server import create_database

    return create_database(admin_url(), f"t{os.getpid()}_{next(_names)}")


def new_catalog(folder: Path, name: str = "catalog") -> Path | str:
    """Where a fresh catalog goes: `folder/NAME.duckdb`, or a fresh PostgreSQL database's URL
    when the suite runs on PostgreSQL. Pass it to Catalog(), --catalog or MERGEPIPE_CATALOG."""
    if ON_POSTGRES:
        return new_database()
    return folder / f"{name}.duckdb"


def copy_catalog(source: Path | str, folder: Path, name: str = "catalog") -> Path | str:
    """A copy of a closed catalog (a copied file, or a database made from it as a template)."""
    if not is_postgres(str(source)):
        return Path(shutil.copy(source, folder / f"{name}.duckdb"))
    import psycopg

    target = f"t{os.getpid()}_{next(_names)}"
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{target}" TEMPLATE "{str(source).rsplit("/", 1)[1]}"')
    return admin_url().rsplit("/", 1)[0] + f"/{target}"


def ingest_status(cat: Catalog, job_id: str | None = None, *, model: str | None = None
                  ) -> str | None:
    """The status of ingestion job `job_id`, or of `model`'s latest one (None: no such job)."""
    from mergepipe.catalog import queue

    row = (queue.get_ingest_job(cat, job_id) if job_id is not None
           else queue.latest_ingest_job(cat, str(model)))
    return None if row is None else row.status
