"""The Ray engine: a merge's output regions as Ray tasks that read and write shared storage."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mergepipe.core.errors import (
    BudgetViolation,
    InvalidRequest,
    MergePipeError,
    RemoteUnavailable,
)
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.executor.prepare import Prepared, output_layout
from mergepipe.executor.regions import combine, create_files, run_region, split_regions
from mergepipe.executor.side_files import copy_side_files
from mergepipe.executor.stream import ExecutionResult
from mergepipe.executor.writer import write_json
from mergepipe.storage.checkpoint import INDEX_FILE
from mergepipe.storage.fsconfine import current_roots
from mergepipe.storage.locations import basename

RAY_TASK_RETRIES = 3  # a region whose worker process dies is run again, this many times
REGIONS_PER_CPU = 2  # regions per CPU of the cluster: a slow region delays the merge less
LOCAL_OBJECT_STORE_BYTES = 256 << 20  # a local runtime's object store (plans and results only)
GCS_PROBE_SECONDS = 5.0  # a cluster address must accept a connection within this


def _probe(address: str) -> None:
    """Refuse a host:port where nothing listens: Ray would retry, then end the whole process."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidRequest(f"Ray address {address!r} is not host:port, auto or ray://host:port",
                             field="ray_address")
    try:
        socket.create_connection((host.strip("[]"), int(port)), GCS_PROBE_SECONDS).close()
    except OSError as e:
        raise RemoteUnavailable(f"cannot start or reach the Ray cluster at {address} "
                                f"(nothing answers there: {e.strerror or e})") from None


class _Runtime:
    """The process's Ray connection: started by the first merge, shut by the last (if ours)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._owned = False

    def acquire(self, address: str | None) -> Any:
        try:
            import ray  # only the Ray engine loads it (start-up: ~1 s)
        except ImportError:
            raise InvalidRequest("--engine ray needs Ray: pip install 'mergepipe[cluster]'",
                                 field="engine") from None
        with self._lock:
            if self._users == 0 and not ray.is_initialized():
                try:
                    if address:
                        _probe(address)
                        ray.init(address=address, log_to_driver=False,
                                 logging_level=logging.ERROR)
                    else:
                        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False,
                                 object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                                 log_to_driver=False, logging_level=logging.ERROR)
                except MergePipeError:
                    raise
                except Exception as e:  # noqa: BLE001 - whatever Ray raises (a dashboard
                    # agent dying at start-up surfaces as a bare Exception): it did not start
                    with contextlib.suppress(Exception):
                        ray.shutdown()  # what did start of a runtime that failed
                    where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
                    text = " ".join(str(e).split()) or type(e).__name__
                    raise RemoteUnavailable(f"cannot start or reach {where} "
                                            f"({type(e).__name__}): {text}") from None
                self._owned = True
            self._users += 1
        return ray

    def release(self) -> None:
        import ray

        with self._lock:
            self._users -= 1
            if self._users == 0 and self._owned:
                self._owned = False
                ray.shutdown()


RUNTIME = _Runtime()  # shared by the merges (here) and ingestions (executor.ray_ingest)


def execute_ray(prep: Prepared, out_dir: Path, *, address: str | None = None,
                threads: int | None = None, progress: ProgressFn | None = None,
                first_pass: bool = False, regions: int | None = None) -> ExecutionResult:
    """stream.execute's result and bytes, computed by Ray tasks (one per output region)."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir).absolute()
    layout = output_layout(prep)
    metadata = {basename(h.path): h.metadata for h in prep.checkpoint.files}
    total_bytes = create_files(out_dir, layout, metadata)
    ray = RUNTIME.acquire(address)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        regs = split_regions(layout, regions or REGIONS_PER_CPU * max(1, cpus))
        task = ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES,
                          retry_exceptions=False)(run_region)
        prep_ref = ray.put(prep)
        roots = current_roots()
        pending = [task.remote(prep_ref, str(out_dir), layout, metadata, r,
                               first_pass=first_pass, threads=threads, roots=roots)
                   for r in regs]
        results = _gather(ray, pending, prep, progress)
    finally:
        RUNTIME.release()
    result = combine(layout, regs, results, time.perf_counter() - t0)
    if result.expert_bytes_read > prep.plan.budget_bytes:
        raise BudgetViolation(f"read {result.expert_bytes_read} expert bytes, over the budget "
                              f"of {prep.plan.budget_bytes}")
    if prep.checkpoint.has_index:
        write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total_bytes},
                                          "weight_map": {t.name: t.file for t in result.tensors}})
    side = copy_side_files(prep.checkpoint.extra_files, out_dir, prep.out_dtype)
    result.extra_files, result.left_out_files = side.copied, side.left_out
    result.exec_seconds = time.perf_counter() - t0
    return result


def _gather(ray: Any, pending: list[Any], prep: Prepared, progress: ProgressFn | None
            ) -> dict[int, ExecutionResult]:
    """The regions' results as they finish, with progress after each."""
    total = sum(len(prep.base.tensor_blocks(t)) for t in prep.base.tensors)
    results: dict[int, ExecutionResult] = {}
    done = expert = base = 0
    for index, _pid, res in as_finished(ray, pending):
        results[index] = res
        done += res.blocks_total
        expert += res.expert_bytes_read
        base += res.base_bytes_read
        if progress is not None:
            progress(Progress(done, total, "blocks", expert, base))
    return results


def as_finished(ray: Any, pending: list[Any]) -> Iterator[Any]:
    """The tasks' results as they finish."""
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    except BaseException as e:
        for ref in pending:
            ray.cancel(ref, force=True)
        cause = getattr(e, "cause", None)
        if isinstance(e, ray.exceptions.RayTaskError) and isinstance(cause, MergePipeError):
            raise cause from None
        raise
