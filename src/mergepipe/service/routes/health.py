"""GET /healthz: the catalog answers and the workers are alive."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mergepipe.catalog import queue
from mergepipe.catalog.db import outage
from mergepipe.core.errors import MergePipeError
from mergepipe.service.schemas import Health
from mergepipe.service.state import State

router = APIRouter(tags=["health"])


class Unavailable(MergePipeError):
    """The catalog does not answer or no worker is alive."""

    status = 503
    code = "unavailable"
    retry_after_s = 5


@router.get("/healthz", response_model=Health, summary="Liveness and readiness")
def healthz(st: State) -> dict[str, Any]:
    try:
        queue.ping(st.cat)
        queued, running = queue.job_counts(st.cat)
    except Exception as e:  # noqa: BLE001 - any catalog failure means: not healthy
        down = outage(e)
        why = down.message if down is not None else type(e).__name__
        raise Unavailable(f"catalog does not answer ({why})") from None
    alive = sum(t.is_alive() for t in st.runner.threads)
    if alive == 0:
        raise Unavailable("no job worker is alive")
    return {"status": "ok", "workers": alive, "queued": queued, "running": running}
