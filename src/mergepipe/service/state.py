"""What the routes depend on: the app's state (the settings, the catalog and the job runner)
and, for the mutating endpoints, the bearer token (only when MERGEPIPE_API_TOKEN is set)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Unauthorized
from mergepipe.core.settings import Settings
from mergepipe.jobs.runner import JobRunner


@dataclass
class AppState:
    settings: Settings
    cat: Catalog
    runner: JobRunner


async def get_state(request: Request) -> AppState:
    """FastAPI dependency: the app's state (async: no thread-pool hop per request)."""
    st: AppState = request.app.state.mergepipe
    return st


State = Annotated[AppState, Depends(get_state)]


def require_token(request: Request) -> None:
    """FastAPI dependency: 401 unless `Authorization: Bearer <token>` matches the setting."""
    token: str | None = request.app.state.mergepipe.settings.api_token
    if not token:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("invalid bearer token")
