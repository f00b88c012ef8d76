"""POST /v1/sql: one read-only SELECT over the catalog, with row and time limits."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mergepipe.catalog.user_sql import run_user_sql
from mergepipe.service.schemas import SqlIn, SqlOut
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["sql"])


@router.post("/sql", response_model=SqlOut,
             summary="Read-only SQL (one SELECT; no files, no network, row and time limits)")
def sql(body: SqlIn, st: State) -> dict[str, Any]:
    return run_user_sql(st.cat, body.sql, row_limit=st.settings.sql_row_limit,
                        timeout_s=st.settings.sql_timeout_s,
                        byte_limit=st.settings.sql_result_bytes)
