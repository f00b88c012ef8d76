"""Prometheus metrics at /metrics (job and queue gauges read from the catalog at each scrape,
the same on every replica) and a request id on every request."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mergepipe.catalog import queue, records
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import Job
from mergepipe.core.logs import REQUEST_ID, request_id_from
from mergepipe.core.settings import Settings
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_slots import slots_for
from mergepipe.storage.store_types import NETWORK

log = logging.getLogger("mergepipe.service.telemetry")

# merges take seconds to hours; ingestions likewise
JOB_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    """The service's metrics, in a registry of its own (one per app); the catalog's gauges
    join when the catalog opens (attach)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.cat: Catalog | None = None
        self.requests = Counter("mergepipe_http_requests", "HTTP requests served",
                                ("method", "route", "status"), registry=self.registry)
        self.job_seconds = Histogram("mergepipe_job_duration_seconds",
                                     "Run time of the jobs this process ran",
                                     ("kind", "status"), buckets=JOB_BUCKETS,
                                     registry=self.registry)
        self.jobs_run = Counter("mergepipe_jobs_run", "Jobs this process ran, by final status",
                                ("kind", "status"), registry=self.registry)
        self.bytes_read = Counter("mergepipe_bytes_read",
                                  "Checkpoint bytes read by the merges this process ran",
                                  ("kind",), registry=self.registry)

    def attach(self, cat: Catalog, settings: Settings) -> None:
        self.cat = cat
        self.registry.register(_CatalogCollector(cat, SqlLimits.from_settings(settings)))

    def observe_job(self, job: Job, seconds: float) -> None:
        """After a job ran (a runner observer): its duration, status and bytes read."""
        assert self.cat is not None
        try:
            if job.kind == "ingest":
                row = queue.get_ingest_job(self.cat, job.id)
                status = row.status if row else "unknown"
            else:
                merge = records.find_merge(self.cat, job.id)
                status = merge.status if merge else "unknown"
                if merge is not None:
                    self.bytes_read.labels("expert").inc(merge.expert_bytes_read or 0)
                    self.bytes_read.labels("base").inc(merge.base_bytes_read or 0)
        except Exception:  # noqa: BLE001 - metrics never fail a job
            log.warning("could not read job %s %s for the metrics", job.kind, job.id)
            status = "unknown"
        self.jobs_run.labels(job.kind, status).inc()
        self.job_seconds.labels(job.kind, status).observe(seconds)


class _CatalogCollector(Collector):
    """Gauges read at scrape time: jobs by kind and status, queue age, SQL slots, network."""

    def __init__(self, cat: Catalog, sql_limits: SqlLimits) -> None:
        self.cat, self.sql_limits = cat, sql_limits

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("mergepipe_jobs", "Jobs in the catalog by kind and status",
                                 labels=("kind", "status"))
        age = GaugeMetricFamily("mergepipe_queue_oldest_seconds",
                                "Age of the oldest queued job, by kind", labels=("kind",))
        depth = GaugeMetricFamily("mergepipe_queue_depth", "Queued jobs, by kind",
                                  labels=("kind",))
        try:
            counts = queue.jobs_by_status(self.cat)
        except Exception as e:  # noqa: BLE001 - an unreachable catalog is a value, not an error
            log.warning("metrics: the catalog does not answer (%s)", type(e).__name__)
            counts = None
        up = _gauge("mergepipe_catalog_up", "1 when the catalog answered this scrape",
                    counts is not None)
        if counts is not None:
            queued = {"ingest": (0, 0.0), "merge": (0, 0.0)}
            for c in counts:
                jobs.add_metric([c.kind, c.status], c.count)
                if c.status == "queued":
                    queued[c.kind] = (c.count, c.oldest_s)
            for kind, (n, oldest) in queued.items():
                depth.add_metric([kind], n)
                age.add_metric([kind], oldest)
        yield from (up, jobs, depth, age)
        slots = slots_for(self.sql_limits)
        yield _gauge("mergepipe_sql_slots", "User-SQL slots of this process", slots.n)
        yield _gauge("mergepipe_sql_slots_in_use", "User-SQL slots running a query", slots.in_use)
        yield _gauge("mergepipe_sql_waiting", "User-SQL queries waiting for a slot", slots.waiting)
        yield _gauge("mergepipe_sql_refusals_total", "User-SQL queries refused with 429 (all "
                     "slots and the queue busy) since the process started", slots.refusals)
        yield _gauge("mergepipe_network_bytes_total",
                     "Body bytes this process fetched from remote storage (S3, HTTP)",
                     NETWORK.bytes)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


class RequestTelemetry:
    """ASGI middleware: the request id (the client's X-Request-ID, else a new one) in the
    context of the request and echoed in the response, and the request counted by route."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id")
        rid = request_id_from(given.decode("latin-1") if given is not None else None)
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        token = REQUEST_ID.set(rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], template, str(status)).inc()


router = APIRouter(tags=["health"])


@router.get("/metrics", summary="Prometheus metrics (text format)",
            response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Any:
    m: Metrics = request.app.state.metrics
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
