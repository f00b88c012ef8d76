"""Register a merge output as a model through ingestion's two phases (scan, then write rows)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import sqlalchemy as sa

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.ingest import ScannedModel, scan_model, write_model
from mergepipe.catalog.scan import FirstPass


def scan_output(cat: Catalog, path: Path, name: str, base: str, merge_id: str,
                first_passes: Mapping[str, FirstPass] | None = None) -> ScannedModel:
    """Ingestion's scan phase over the published output: rows with statistics against the
    base, computed without writing to the catalog. `first_passes`: the executor's first scan
    pass over the output's blocks (the output is then read only for threshold refinement)."""
    return scan_model(cat, path, name, base=base, kind="full", with_stats=True,
                      source_merge=merge_id, first_passes=first_passes)


def register_output(conn: sa.Connection, scanned: ScannedModel) -> None:
    """Ingestion's write phase, inside the caller's transaction (with status 'succeeded')."""
    write_model(conn, scanned)
