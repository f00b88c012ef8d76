"""Worker threads that take queued ingestions and merges from the catalog and run them."""

from __future__ import annotations

import contextlib
import logging
import queue as fifo
import threading
import time
from collections.abc import Callable, Sequence

from mergepipe.catalog import queue, records
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.fence import Fence
from mergepipe.catalog.models import find_model
from mergepipe.catalog.queue import Job
from mergepipe.core.errors import MergePipeError
from mergepipe.core.logs import request_context
from mergepipe.core.progress import Progress
from mergepipe.core.settings import Settings
from mergepipe.executor.engine import Engine
from mergepipe.jobs.ingest import run_ingest_job
from mergepipe.jobs.merge import run_merge
from mergepipe.jobs.recovery import recover_interrupted, remove
from mergepipe.storage.paths import temp_dirs
from mergepipe.storage.remote import remote_scope

log = logging.getLogger("mergepipe.jobs.runner")

_STOP = Job("stop", "")


class JobRunner:
    """A FIFO of jobs and N worker threads; live progress is kept in memory while jobs run."""

    def __init__(self, cat: Catalog, settings: Settings) -> None:
        self.cat = cat
        self.settings = settings
        self.queue: fifo.Queue[Job] = fifo.Queue()
        self.threads: list[threading.Thread] = []
        self.stopping = threading.Event()
        self.changed = threading.Condition()   # notified whenever a job finishes
        self.progress: dict[Job, Progress] = {}
        self.running: set[Job] = set()
        # called after each job that ran, with its run time (the service's metrics)
        self.observers: list[Callable[[Job, float], None]] = []

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Recover from a previous crash, resume queued jobs, start the workers."""
        self.recover()
        for job in queue.queued_jobs(self.cat):
            self.queue.put(job)
        for i in range(max(1, self.settings.workers)):
            t = threading.Thread(target=self._work, name=f"mergepipe-worker-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def recover(self) -> None:
        """Jobs that were running when the server died: failed; their temp outputs: removed."""
        recover_interrupted(self.cat, error=None)  # disk only; queue.recover says why it failed
        queue.recover(self.cat)
        for tmp in temp_dirs(self.settings.output_root):
            log.warning("removing the temporary output %s of an interrupted merge", tmp)
            remove(tmp)

    def stop(self, grace_s: float | None = None) -> bool:
        """Stop taking jobs; wait up to `grace_s` for running ones. True if all workers ended.

        Jobs still queued stay queued in the catalog and resume at the next start-up."""
        self.stopping.set()
        self._wake_workers()
        deadline = time.monotonic() + (self.settings.shutdown_grace_s if grace_s is None
                                       else grace_s)
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self.changed:
            self.changed.notify_all()
        return not any(t.is_alive() for t in self.threads)

    def _wake_workers(self) -> None:
        """Tell every worker thread to stop waiting for a job."""
        for _ in self.threads:
            self.queue.put(_STOP)

    # -- submitting and watching --------------------------------------------------------------
    def submit(self, job: Job) -> None:
        self.queue.put(job)

    def live_progress(self, job: Job) -> Progress | None:
        return self.progress.get(job)

    # -- the workers ------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self.queue.get()
            try:
                if job == _STOP:
                    return
                if self.stopping.is_set():
                    continue  # left queued in the catalog for the next start
                with self.changed:
                    self.running.add(job)
                try:
                    self._run(job)
                except Exception:  # noqa: BLE001 - a worker must survive any job
                    log.exception("job %s %s crashed", job.kind, job.id)
                finally:
                    with self.changed:
                        self.running.discard(job)
                        self.progress.pop(job, None)
                        self.changed.notify_all()
            finally:
                self.queue.task_done()

    def _scope(self) -> contextlib.AbstractContextManager[None]:
        """The remote scope a job runs in: redirects confined to the remote roots, every
        remote call over by the job's time limit (MERGEPIPE_JOB_TIMEOUT_S) from its start."""
        return remote_scope(self.settings.remote_roots, self.settings.job_timeout_s)

    def _run(self, job: Job) -> None:
        """Run `job` if it is still queued and its inputs are ready, then tell the observers."""
        started = time.monotonic()
        if self._execute(job):
            elapsed = time.monotonic() - started
            log.info("%s %s ran for %.2f s", job.kind, job.id, elapsed)
            for observe in self.observers:
                observe(job, elapsed)

    def _execute(self, job: Job) -> bool:
        """Run `job` under the request id that queued it; False if it did not run (not queued
        any more, or sent back to the queue to wait for an input)."""
        def track(p: Progress) -> None:
            self.progress[job] = p

        if job.kind == "ingest":
            row = queue.get_ingest_job(self.cat, job.id)
            if row is None or row.status != "queued" or not self._inputs_ready(job, [row.base]):
                return False
            with request_context(row.request_id), self._scope():
                log.info("ingestion %s of %r started", job.id, row.model)
                run_ingest_job(self.cat, job.id, data_roots=self.settings.data_roots,
                               remote_roots=self.settings.remote_roots,
                               progress=track, fence=self._fence(job),
                               engine=Engine.of(self.settings))
            return True
        merge = records.find_merge(self.cat, job.id)
        if merge is None or merge.status != "queued":
            return False
        names = [merge.base] + [str(e.get("model")) for e in merge.request.get("experts", [])]
        if not self._inputs_ready(job, names):
            return False
        with request_context(merge.request_id), self._scope():
            log.info("merge %s started", job.id)
            try:
                finish = None
                if merge.request.get("tokenizer") is not None:  # a config's tokenizer options
                    from mergepipe.jobs.reindex import queued_step  # torch: only for them

                    finish = queued_step(merge.request)
                run_merge(self.cat, job.id, progress=track, data_roots=self.settings.data_roots,
                          output_root=self.settings.output_root,
                          engine=Engine.of(self.settings), fence=self._fence(job),
                          finish=finish)
            except Exception as e:  # noqa: BLE001 - recorded on the merge by run_merge
                if not isinstance(e, MergePipeError):
                    log.exception("merge %s failed", job.id)
        return True

    def _fence(self, job: Job) -> Fence | None:
        """The lease a shared catalog's worker holds `job` under; none in a single process."""
        return None

    def _inputs_ready(self, job: Job, names: Sequence[str | None]) -> bool:
        """Wait while an input of `job` is being ingested. False (and the job goes back to the
        end of the queue) while such an ingestion has not started, so that a worker never waits
        on a job queued behind it; False too when stopping."""
        for name in names:
            while name is not None and not self.stopping.is_set():
                active = queue.active_ingest_job(self.cat, name)
                if active is None or find_model(self.cat, name) is not None:
                    break
                if active.status == "queued" and Job("ingest", active.job_id) not in self.running:
                    self.queue.put(job)
                    return False
                with self.changed:
                    self.changed.wait(0.2)
        return not self.stopping.is_set()

