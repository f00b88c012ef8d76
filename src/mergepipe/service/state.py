"""What the routes depend on: the app's state (the settings, the catalog and the job runner);
the bearer tokens are checked before any route runs (access.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from mergepipe.catalog.db import Catalog
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
