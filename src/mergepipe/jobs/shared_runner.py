"""Worker threads of one of several servers and workers on a shared (PostgreSQL) catalog.

Jobs are not handed from an in-process queue: each thread claims the oldest free job from the
catalog (SELECT ... FOR UPDATE SKIP LOCKED), holds it under a lease that a heartbeat renews, and
a job whose worker died (its lease expired while running) is taken over by another worker after
its partial output is removed. Nothing is recovered at start-up: other processes are running."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence

from mergepipe.catalog import leases, queue, records
from mergepipe.catalog.connection import CatalogUnavailable
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.fence import Fence
from mergepipe.catalog.models import find_model
from mergepipe.catalog.queue import Job
from mergepipe.core.settings import Settings
from mergepipe.jobs.outage import Outage
from mergepipe.jobs.recovery import clean_merge_outputs
from mergepipe.jobs.runner import JobRunner

log = logging.getLogger("mergepipe.jobs.shared_runner")

POLL_S = 0.5  # how often an idle thread looks for a job (a submit in this process wakes it)
RETRY_S = 1.0  # a job whose inputs are still being ingested is claimed again after this


class SharedJobRunner(JobRunner):
    """JobRunner's interface (start, stop, submit, live progress) over the catalog's job queue."""

    def __init__(self, cat: Catalog, settings: Settings) -> None:
        super().__init__(cat, settings)
        self.worker = leases.worker_id()
        self.lease_s = settings.lease_s
        self.wake = threading.Event()
        self.held: set[Job] = set()
        self.fences: dict[Job, Fence] = {}  # the claim each held job runs under
        self.outage = Outage()  # the catalog down: back off, one log line

    def start(self) -> None:
        for i in range(max(1, self.settings.workers)):
            t = threading.Thread(target=self._claim_loop, name=f"mergepipe-worker-{i}",
                                 daemon=True)
            t.start()
            self.threads.append(t)
        threading.Thread(target=self._heartbeat, name="mergepipe-heartbeat", daemon=True).start()
        log.info("worker %s: lease %.0fs", self.worker, self.lease_s)

    def _wake_workers(self) -> None:
        self.wake.set()

    def submit(self, job: Job) -> None:
        self.wake.set()  # the job is in the catalog: any worker of any process may take it

    # -- the workers ------------------------------------------------------------------------
    def _claim_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                got = leases.claim(self.cat, self.worker, self.lease_s)
                self.outage.succeeded()
            except CatalogUnavailable as e:
                self.stopping.wait(self.outage.failed(e))
                continue
            except Exception:  # noqa: BLE001 - a worker must survive any error
                log.exception("worker %s could not claim a job", self.worker)
                got = None
            if got is None:
                self.wake.wait(POLL_S)
                self.wake.clear()
                continue
            self._run_claimed(got)

    def _run_claimed(self, got: leases.Claimed) -> None:
        job = got.job
        with self.changed:
            self.held.add(job)
            self.running.add(job)
            self.fences[job] = Fence(self.worker, uuid.uuid4().hex[:6])
        try:
            if got.taken_over:
                log.warning("taking over %s %s: its worker's lease expired", job.kind, job.id)
                self._clean(job)
            self._run(job)
            if self._still_queued(job):  # inputs not ingested yet: back to the queue, later
                leases.release(self.cat, job, self.worker, retry_after_s=RETRY_S)
        except CatalogUnavailable as e:  # its lease expires: a worker takes it over later
            self.stopping.wait(self.outage.failed(e))
        except Exception:  # noqa: BLE001 - a worker must survive any job
            log.exception("job %s %s crashed", job.kind, job.id)
        finally:
            with self.changed:
                self.held.discard(job)
                self.fences.pop(job, None)
                self.running.discard(job)
                self.progress.pop(job, None)
                self.changed.notify_all()

    def _clean(self, job: Job) -> None:
        """What a dead run left: a merge's staging directory or unrecorded output. Ingestion
        writes its catalog rows in one transaction: nothing half-made to remove; if the dead
        run wrote them but died before recording the job's end, the job has succeeded."""
        if job.kind == "merge":
            row = records.find_merge(self.cat, job.id)
            if row is not None:
                clean_merge_outputs(row)
            return
        ing = queue.get_ingest_job(self.cat, job.id)
        if ing is not None and find_model(self.cat, ing.model) is not None:
            queue.finish_ingest_job(self.cat, job.id, error=None, done_bytes=ing.total_bytes,
                                    total_bytes=ing.total_bytes)

    def _fence(self, job: Job) -> Fence | None:
        return self.fences.get(job)

    def _still_queued(self, job: Job) -> bool:
        if job.kind == "ingest":
            row = queue.get_ingest_job(self.cat, job.id)
            return row is not None and row.status == "queued"
        merge = records.find_merge(self.cat, job.id)
        return merge is not None and merge.status == "queued"

    def _inputs_ready(self, job: Job, names: Sequence[str | None]) -> bool:
        """An input still being ingested (by any worker): not ready, try again later."""
        for name in names:
            if name is not None and queue.active_ingest_job(self.cat, str(name)) is not None:
                return False
        return not self.stopping.is_set()

    def _heartbeat(self) -> None:
        """Renew the leases of the jobs this process holds, every third of the lease."""
        while True:
            time.sleep(self.lease_s / 3)
            if self.stopping.is_set() and not self.held:
                return
            for job in list(self.held):
                try:
                    if not leases.renew(self.cat, job, self.worker, self.lease_s):
                        log.debug("lease of %s %s not renewed (finished or lost)", job.kind,
                                  job.id)
                except CatalogUnavailable as e:
                    self.outage.failed(e)  # retried at the next beat
                except Exception:  # noqa: BLE001 - retried at the next beat
                    log.exception("heartbeat of %s %s failed", job.kind, job.id)
