"""One ingestion end to end: confine its path, register the checkpoint, record the job's outcome."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from mergepipe.catalog import queue
from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.fence import Fence, LeaseLost, hold_ingest
from mergepipe.catalog.ingest import ingest_model
from mergepipe.catalog.models import ModelRow
from mergepipe.catalog.queue import NewIngestJob
from mergepipe.core.errors import MergePipeError, failure_message
from mergepipe.core.hooks import hooks
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.vocab import AUTO
from mergepipe.executor.engine import LOCAL, Engine
from mergepipe.jobs.config import has_adapter_config
from mergepipe.storage.fsconfine import confined
from mergepipe.storage.grid import DEFAULT_BLOCK_BYTES
from mergepipe.storage.locations import is_url, parse_url
from mergepipe.storage.paths import confine_url, recheck_input

log = logging.getLogger("mergepipe.jobs.ingest")


def run_ingestion(cat: Catalog, job: NewIngestJob, *, data_roots: Sequence[Path] = (),
                  remote_roots: Sequence[str] | None = None,
                  progress: ProgressFn | None = None,
                  guard: Callable[[Connection], None] | None = None,
                  engine: Engine = LOCAL) -> ModelRow:
    """Register `job.path` (a local path or a URL) as model `job.model`. The service passes
    its roots: the path must still lie inside them when the job starts, and every file is
    opened beneath its root (storage.fsconfine): a link swapped in later is refused too.
    `engine` ray: the statistics of a sharded checkpoint are one Ray task per shard file."""
    path = job.path
    if is_url(path):
        if remote_roots is not None:
            confine_url(path, remote_roots, field=job.field)
        if parse_url(path).scheme == "hf":  # the model records the commit its revision names
            from mergepipe.storage.hub import pin

            path = pin(path)
    elif data_roots:
        recheck_input(path, data_roots, field=job.field)
    with confined(data_roots) if data_roots else contextlib.nullcontext():
        kind = job.kind
        if kind == AUTO:  # a config's URL: an adapter directory, or a full checkpoint
            kind = "lora" if has_adapter_config(path) else "full"
        return ingest_model(cat, path, job.model, base=job.base, kind=kind,
                            block_bytes=job.block_bytes or DEFAULT_BLOCK_BYTES,
                            with_stats=job.with_stats, progress=progress, guard=guard,
                            scan=engine.ingest_scan(), force=job.force)


def run_ingest_job(cat: Catalog, job_id: str, *, data_roots: Sequence[Path],
                   remote_roots: Sequence[str] = (),
                   progress: ProgressFn | None = None, fence: Fence | None = None,
                   engine: Engine = LOCAL) -> None:
    """Run a queued ingestion job and record how it ended (its error is the one users see).
    `fence` (a worker on a shared catalog): its writes are made only while it holds the lease
    (LeaseLost otherwise, nothing written)."""
    row = queue.get_ingest_job(cat, job_id)
    if row is None or row.status != "queued":
        return
    queue.start_ingest_job(cat, job_id, fence)
    hooks().ingest_running(row.model)
    last = Progress(0, 0, "bytes", model=row.model)

    def track(p: Progress) -> None:
        nonlocal last
        last = Progress(p.done, p.total, "bytes", model=row.model)
        if progress is not None:
            progress(last)

    error: str | None = None
    try:
        run_ingestion(cat, NewIngestJob(row.model, row.kind, row.path, row.base, row.block_bytes,
                                        row.with_stats, field="path",
                                        force=bool(row.force_base)),
                      data_roots=data_roots, remote_roots=remote_roots, progress=track,
                      guard=lambda conn: hold_ingest(conn, job_id, fence), engine=engine)
    except LeaseLost:
        raise  # another worker owns the job now: record nothing
    except Exception as e:  # noqa: BLE001 - recorded on the job; the worker goes on
        if not isinstance(e, MergePipeError):
            log.exception("ingestion %s of %r failed", job_id, row.model)
        error = failure_message(e, "ingestion")
    queue.finish_ingest_job(cat, job_id, error=error, done_bytes=last.done,
                            total_bytes=last.total, fence=fence)
