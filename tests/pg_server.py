"""A real PostgreSQL server for the tests, from the machine's binaries, on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mergepipe.benchmarks.pg_local import local_postgres


@contextmanager
def postgres_server() -> Iterator[str]:
    """A server for the test session (benchmarks.pg_local's recipe, with room for the suite's
    connections); yields the superuser's SQLAlchemy URL (database `postgres`). Stopped and
    removed afterwards."""
    with local_postgres(200, "shared_buffers=32MB") as pg:
        yield pg.url


def create_database(admin_url: str, name: str) -> str:
    """A fresh empty database on the server of `admin_url`; its URL."""
    import psycopg

    conninfo = admin_url.replace("postgresql://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"
