"""Register a merge output as a model through ingestion's two phases (scan, then write rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from catalog.db import Catalog


def scan_output(cat: Catalog, path: Path, name: str, base: str, merge_id: str) -> Any:
    """Ingestion's scan phase over the published output (reads only; no catalog writes)."""
    from catalog import ingest
    return ingest.scan_model(cat, path, name, base=base, kind="full", with_stats=True,
                             source_merge=merge_id)


def register_output(conn: sa.Connection, scanned: Any) -> None:
    """Ingestion's write phase, inside the caller's transaction."""
    from catalog import ingest
    ingest.write_model(conn, scanned)
