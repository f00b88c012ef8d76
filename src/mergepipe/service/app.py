"""create_app(settings): the FastAPI application, its routers, handler, limits and workers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.dialect import display
from mergepipe.core import checkpoint_limits, logs
from mergepipe.core.settings import Settings
from mergepipe.jobs.runner import JobRunner
from mergepipe.jobs.shared_runner import SharedJobRunner
from mergepipe.sandbox.sql_snapshot import remove_stale
from mergepipe.service import errors, telemetry
from mergepipe.service.access import AccessGuard, BodyLimit
from mergepipe.service.routes import (
    calibrations,
    compare,
    console,
    health,
    lineage,
    merges,
    models,
    operators,
    plans,
    sql,
)
from mergepipe.service.state import AppState

log = logging.getLogger("mergepipe.service")

DESCRIPTION = """Budgeted, catalog-planned merging of LLM checkpoint families.

Register checkpoints with `POST /v1/models` (an ingestion job), dry-run a plan with
`POST /v1/plans`, run a merge with `POST /v1/merges` and follow it with `GET /v1/merges/{id}`.
Every error is `{"error": {"code", "message", "field"?}}`. Every response carries an
`X-Request-ID` (the client's, else a new one), also recorded on the jobs a request queues.
Prometheus metrics are at `/metrics`. When the server has an API token,
`POST /v1/models` and `POST /v1/merges` need `Authorization: Bearer <token>`. A web console
over this API is served at `/`."""


def create_app(settings: Settings, catalog: Catalog | None = None) -> FastAPI:
    """The application; the catalog opens (and migrates) and the workers start at start-up.
    `catalog`: one already open (`serve` opens it first, to report a catalog it cannot use in
    one line), closed with the application."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        previous_limits = checkpoint_limits.install(settings.checkpoint_limits())
        remove_stale()  # SQL snapshot folders of servers killed without cleaning up
        cat = catalog if catalog is not None else Catalog(settings.catalog)
        # a PostgreSQL catalog is shared with other servers and workers: claim jobs from it
        runner = (SharedJobRunner if cat.postgres else JobRunner)(cat, settings)
        app.state.mergepipe = AppState(settings=settings, cat=cat, runner=runner)
        metrics.attach(cat, settings)
        runner.observers.append(metrics.observe_job)
        runner.start()
        log.info("catalog %s, output root %s, %d worker(s), data roots %s",
                 display(settings.catalog), settings.output_root, settings.workers,
                 ":".join(map(str, settings.data_roots)) or "(none)")
        try:
            yield
        finally:
            if not runner.stop():
                log.warning("jobs still running after %.0fs; they are marked failed at the "
                            "next start-up", settings.shutdown_grace_s)
            cat.close()
            checkpoint_limits.install(previous_limits)

    logs.install_record_factory()  # log lines carry the request id (core/logs.py)
    # /docs: Swagger UI from packaged files (routes/console.py), not from a CDN; no ReDoc page
    app = FastAPI(title="MergePipe", version="1", description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    metrics = app.state.metrics = telemetry.Metrics()
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(AccessGuard, settings=settings)  # before the body is read
    # outermost: every response, refusals included, carries the request id and is counted
    app.add_middleware(telemetry.RequestTelemetry, metrics=metrics)
    for r in (health.router, models.router, plans.router, merges.router, lineage.router,
              sql.router, operators.router, compare.router, telemetry.router,
              calibrations.router):
        app.include_router(r)
    console.install(app)
    return app
