"""The service's catalog reads and writes (its SQL lives in service/sql/svc_*.sql)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Any

from mergepipe.catalog.db import Catalog, register_sql_package

register_sql_package("mergepipe.service")

JSON_COLUMNS = ("request", "params", "plan")
MAX_LINEAGE_DEPTH = 64


def jsonable(v: Any) -> Any:
    """A catalog value as plain JSON (timestamps as ISO 8601, JSON columns parsed by caller)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # 'nan', 'inf', '-inf': JSON has no such numbers
    if isinstance(v, dt.datetime | dt.date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    return v


def _row(r: Any) -> dict[str, Any]:
    d = {k: jsonable(v) for k, v in r._mapping.items()}
    for k in JSON_COLUMNS:
        if isinstance(d.get(k), str):
            with contextlib.suppress(ValueError):
                d[k] = json.loads(d[k])
    return d


def _one(cat: Catalog, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    rows = cat.query(name, params)
    return _row(rows[0]) if rows else None


def _all(cat: Catalog, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [_row(r) for r in cat.query(name, params or {})]


# -- ingestion jobs ---------------------------------------------------------------------------
def new_ingest_job(cat: Catalog, *, model: str, kind: str, path: str, base: str | None,
                   block_bytes: int | None, with_stats: bool) -> str:
    job_id = f"ing-{uuid.uuid4().hex[:16]}"
    cat.execute("svc_insert_ingest_job", {
        "job_id": job_id, "model": model, "kind": kind, "path": path, "base": base,
        "block_bytes": block_bytes, "with_stats": with_stats})
    return job_id


def get_ingest_job(cat: Catalog, job_id: str) -> dict[str, Any] | None:
    return _one(cat, "svc_get_ingest_job", {"job_id": job_id})


def latest_ingest_job(cat: Catalog, model: str) -> dict[str, Any] | None:
    return _one(cat, "svc_latest_ingest_job", {"model": model})


def unfinished_ingest_models(cat: Catalog) -> list[dict[str, Any]]:
    return _all(cat, "svc_unfinished_ingest_models")


def active_ingest_job(cat: Catalog, model: str) -> dict[str, Any] | None:
    """{job_id, status} of the queued or running ingestion of `model`, or None."""
    return _one(cat, "svc_active_ingest_job", {"model": model})


def start_ingest_job(cat: Catalog, job_id: str) -> None:
    cat.execute("svc_start_ingest_job", {"job_id": job_id})


def finish_ingest_job(cat: Catalog, job_id: str, *, error: str | None, done_bytes: int,
                      total_bytes: int) -> None:
    cat.execute("svc_finish_ingest_job", {
        "job_id": job_id, "status": "failed" if error else "succeeded", "error": error,
        "done_bytes": done_bytes, "total_bytes": total_bytes})


# -- merges -----------------------------------------------------------------------------------
def get_merge(cat: Catalog, merge_id: str) -> dict[str, Any] | None:
    return _one(cat, "svc_get_merge", {"merge_id": merge_id})


def merge_experts(cat: Catalog, merge_id: str) -> list[dict[str, Any]]:
    return _all(cat, "svc_merge_experts", {"merge_id": merge_id})


def list_merges(cat: Catalog, limit: int, offset: int) -> list[dict[str, Any]]:
    return _all(cat, "svc_list_merges", {"limit": limit, "offset": offset})


def pending_output(cat: Catalog, name: str) -> str | None:
    rows = cat.query("svc_pending_output", {"name": name})
    return str(rows[0][0]) if rows else None


def fail_merge(cat: Catalog, merge_id: str, error: str) -> None:
    cat.execute("svc_fail_merge", {"merge_id": merge_id, "error": error})


def touched_count(cat: Catalog, merge_id: str) -> int:
    return int(cat.query("svc_touched_count", {"merge_id": merge_id})[0][0])


def touched_page(cat: Catalog, merge_id: str, *, after_rank: int, limit: int, offset: int
                 ) -> list[dict[str, Any]]:
    return _all(cat, "svc_touched_page", {"merge_id": merge_id, "after_rank": after_rank,
                                          "limit": limit, "offset": offset})


# -- lineage, health, recovery ----------------------------------------------------------------
def lineage(cat: Catalog, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ancestors, descendants): edges with their depth from `name`."""
    p = {"name": name, "max_depth": MAX_LINEAGE_DEPTH}
    return _all(cat, "svc_lineage_ancestors", p), _all(cat, "svc_lineage_descendants", p)


def job_counts(cat: Catalog) -> tuple[int, int]:
    row = cat.query("svc_count_jobs")[0]._mapping
    return int(row["queued"]), int(row["running"])


def ping(cat: Catalog) -> None:
    cat.query("svc_catalog_ping")


def recover(cat: Catalog) -> None:
    """Mark what was running when the server died as failed (one transaction)."""
    from mergepipe.catalog.db import load_sql
    with cat.transaction() as conn:
        conn.execute(load_sql("svc_recover_ingest_jobs"))
        conn.execute(load_sql("svc_recover_merges"))


def queued_jobs(cat: Catalog) -> list[tuple[str, str]]:
    """(kind, id) of the queued jobs, oldest first."""
    return [(str(r.kind), str(r.id)) for r in cat.query("svc_queued_jobs")]
