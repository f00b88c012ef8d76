"""What the routes share: settings, the catalog, the job runner and the name reservation lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
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
    # Held while a name is checked free and claimed (model registration, merge output).
    names: threading.Lock = field(default_factory=threading.Lock)


def get_state(request: Request) -> AppState:
    """FastAPI dependency: the app's state."""
    st: AppState = request.app.state.mergepipe
    return st


State = Annotated[AppState, Depends(get_state)]
