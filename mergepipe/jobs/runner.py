"""Worker threads that run ingestion and merge jobs inside the server process."""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import MergePipeError
from mergepipe.core.settings import Settings
from mergepipe.service import paths, store

log = logging.getLogger("mergepipe.service.jobs")

Job = tuple[str, str]  # (kind, id): ("ingest", job_id) | ("merge", merge_id)
_STOP: Job = ("stop", "")


class JobRunner:
    """A FIFO of jobs and N worker threads; live progress is kept in memory while jobs run."""

    def __init__(self, cat: Catalog, settings: Settings) -> None:
        self.cat = cat
        self.settings = settings
        self.queue: queue.Queue[Job] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.stopping = threading.Event()
        self.changed = threading.Condition()   # notified whenever a job finishes
        self.progress: dict[Job, dict[str, Any]] = {}
        self.running: set[Job] = set()

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Recover from a previous crash, resume queued jobs, start the workers."""
        self.recover()
        for job in store.queued_jobs(self.cat):
            self.queue.put(job)
        for i in range(max(1, self.settings.workers)):
            t = threading.Thread(target=self._work, name=f"mergepipe-worker-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def recover(self) -> None:
        """Jobs that were running when the server died: failed; their temp outputs: removed."""
        from mergepipe.jobs.recovery import recover_interrupted

        recover_interrupted(self.cat, error=None)  # disk only; store.recover says why it failed
        store.recover(self.cat)
        for tmp in paths.temp_dirs(self.settings.output_root):
            log.warning("removing the temporary output %s of an interrupted merge", tmp)
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)

    def stop(self, grace_s: float | None = None) -> bool:
        """Stop taking jobs; wait up to `grace_s` for running ones. True if all workers ended.

        Jobs still queued stay queued in the catalog and resume at the next start-up."""
        self.stopping.set()
        for _ in self.threads:
            self.queue.put(_STOP)
        deadline = time.monotonic() + (self.settings.shutdown_grace_s if grace_s is None
                                       else grace_s)
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self.changed:
            self.changed.notify_all()
        return not any(t.is_alive() for t in self.threads)

    # -- submitting and watching --------------------------------------------------------------
    def submit(self, kind: str, job_id: str) -> None:
        self.queue.put((kind, job_id))

    def live_progress(self, kind: str, job_id: str) -> dict[str, Any] | None:
        return self.progress.get((kind, job_id))

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no job is queued or running (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while self.queue.unfinished_tasks or self.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.1))
        return True

    # -- the workers ------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self.queue.get()
            try:
                if job == _STOP or self.stopping.is_set():
                    if job != _STOP:  # leave it queued in the catalog for the next start
                        continue
                    return
                with self.changed:
                    self.running.add(job)
                try:
                    (self._ingest if job[0] == "ingest" else self._merge)(job[1])
                except Exception:  # noqa: BLE001 - a worker must survive any job
                    log.exception("job %s %s crashed", *job)
                finally:
                    with self.changed:
                        self.running.discard(job)
                        self.progress.pop(job, None)
                        self.changed.notify_all()
            finally:
                self.queue.task_done()

    def _tracker(self, job: Job, keys: tuple[str, str]) -> Callable[..., None]:
        def update(*args: Any) -> None:
            if len(args) == 1 and isinstance(args[0], dict):
                d = args[0]
                done = d.get(keys[0], d.get("done", 0))
                total = d.get(keys[1], d.get("total", 0))
                extra = {k: v for k, v in d.items() if isinstance(v, int | float | str)}
            else:
                done, total = args[0], args[1]
                extra = {}
            self.progress[job] = {**extra, "done": int(done or 0), "total": int(total or 0)}
        return update

    def _wait_for_base(self, job_id: str, base: str) -> bool:
        """An expert registered right after its base waits for the base's ingestion to end.

        False (and the job goes back to the end of the queue) while the base's job has not
        started, so that a worker never waits on a job queued behind it."""
        while not self.stopping.is_set():
            active = store.active_ingest_job(self.cat, base)
            if active is None:
                return True
            if active["status"] == "queued" and ("ingest", active["job_id"]) not in self.running:
                self.queue.put(("ingest", job_id))
                return False
            with self.changed:
                self.changed.wait(0.2)
        return False

    def _ingest(self, job_id: str) -> None:
        from mergepipe.catalog.ingest import DEFAULT_BLOCK_BYTES, ingest_model

        job = store.get_ingest_job(self.cat, job_id)
        if job is None or job["status"] != "queued":
            return
        if job["base"] and not self._wait_for_base(job_id, job["base"]):
            return
        store.start_ingest_job(self.cat, job_id)
        key: Job = ("ingest", job_id)
        track = self._tracker(key, ("done_bytes", "total_bytes"))
        track(0, 0)
        error: str | None = None
        try:
            paths.recheck_input(job["path"], self.settings.data_roots)
            ingest_model(self.cat, Path(job["path"]), job["model"], base=job["base"],
                         kind=job["kind"], block_bytes=job["block_bytes"] or DEFAULT_BLOCK_BYTES,
                         with_stats=job["with_stats"], progress=track)
        except MergePipeError as e:
            error = e.message
        except Exception as e:  # noqa: BLE001 - recorded on the job; the worker goes on
            log.exception("ingestion %s of %r failed", job_id, job["model"])
            error = f"internal error during ingestion ({_brief(e)})"
        p = self.progress.get(key, {})
        store.finish_ingest_job(self.cat, job_id, error=error, done_bytes=p.get("done", 0),
                                total_bytes=p.get("total", 0))

    def _merge(self, merge_id: str) -> None:
        from mergepipe.jobs.merge import run_merge

        row = store.get_merge(self.cat, merge_id)
        if row is None or row["status"] != "queued":
            return
        key: Job = ("merge", merge_id)
        track = self._tracker(key, ("blocks_done", "blocks_total"))
        try:
            self._recheck_sources(row["request"])
            run_merge(self.cat, merge_id, progress=track)
        except MergePipeError as e:
            store.fail_merge(self.cat, merge_id, e.message)
        except Exception as e:  # noqa: BLE001 - recorded on the merge; the worker goes on
            log.exception("merge %s failed", merge_id)
            store.fail_merge(self.cat, merge_id, f"internal error during the merge ({_brief(e)})")

    def _recheck_sources(self, request: Any) -> None:
        """The directories of the merge's models inside the data roots still hold no link out
        of them (the merge reads the experts and copies the base's config files)."""
        from mergepipe.catalog.models import find_model

        if not isinstance(request, dict):
            return
        names = [("base", request.get("base"))]
        names += [(f"experts[{i}].model", e.get("model"))
                  for i, e in enumerate(request.get("experts") or []) if isinstance(e, dict)]
        for field, name in names:
            m = find_model(self.cat, str(name)) if name else None
            if m is not None and m.get("path"):
                paths.recheck_input(str(m["path"]), self.settings.data_roots, field=field)


def _brief(e: BaseException) -> str:
    """Type and first line of an unexpected error, short enough for a status field."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"
