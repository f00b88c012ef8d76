"""POST /v1/sql: one read-only SELECT over the catalog, in the SQL sandbox (core/sql_limits.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.user_sql import run_user_sql_async
from mergepipe.service.schemas import SqlIn, SqlOut
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["sql"])


@router.post("/sql", response_model=SqlOut,
             summary="Read-only SQL (one SELECT; no files, no network, row and time limits)")
async def sql(body: SqlIn, st: State) -> dict[str, Any]:
    # async: the query runs in one of the sandbox's slot threads, never in a request thread
    return await run_user_sql_async(st.cat, body.sql, SqlLimits.from_settings(st.settings))
