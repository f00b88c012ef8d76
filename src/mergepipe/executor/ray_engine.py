"""The Ray engine: a merge's output regions as Ray tasks that read and write shared storage."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mergepipe.core.errors import (
    BudgetViolation,
    InvalidRequest,
    MergePipeError,
    RemoteUnavailable,
)
from mergepipe.core.hooks import hooks
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.vocab import DTYPE_SIZES
from mergepipe.executor.prepare import Prepared, output_layout
from mergepipe.executor.side_files import copy_side_files
from mergepipe.executor.stream import ExecutionResult, execute, output_hash
from mergepipe.executor.writer import CheckpointWriter, OutputTensor, write_index
from mergepipe.storage.fsconfine import confined, current_roots
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
    files = CheckpointWriter(out_dir, layout, metadata=metadata)
    files.abort()  # created, sized and closed: the regions write the data
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
        write_index(out_dir, files.total_bytes, result.tensors)
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


# -- output regions: runs of whole tensors of one output file, each executed alone by a task,
# with the local engine's blocks and kernels (so its bytes); `combine` checks and joins them.
# (file name, [(tensor, dtype, shape), ...]) in output order: prepare.output_layout's shape
Layout = list[tuple[str, list[tuple[str, str, tuple[int, ...]]]]]


@dataclass(frozen=True)
class Region:
    """A run of whole tensors of one output file, written by one task."""

    index: int
    file: str
    tensors: tuple[str, ...]
    nbytes: int  # output bytes of its tensors


def split_regions(layout: Layout, parts: int) -> list[Region]:
    """About `parts` regions of similar bytes: whole tensors, one per file at least."""
    total = sum(math.prod(s) * DTYPE_SIZES[d] for _, specs in layout for _, d, s in specs)
    target = max(1, total // max(1, parts))
    regions: list[Region] = []
    for fname, specs in layout:
        cur: list[str] = []
        cur_bytes = 0
        for name, dtype, shape in specs:
            cur.append(name)
            cur_bytes += math.prod(shape) * DTYPE_SIZES[dtype]
            if cur_bytes >= target:
                regions.append(Region(len(regions), fname, tuple(cur), cur_bytes))
                cur, cur_bytes = [], 0
        if cur or not specs:
            regions.append(Region(len(regions), fname, tuple(cur), cur_bytes))
    return regions


def region_prepared(prep: Prepared, region: Region) -> Prepared:
    """The prepared merge restricted to the region's tensors (no index, no side files)."""
    keep = set(region.tensors)
    base = replace(prep.base, tensors={n: t for n, t in prep.base.tensors.items() if n in keep})
    return replace(prep, base=base,
                   selected={k: v for k, v in prep.selected.items() if k[1] in keep},
                   checkpoint=replace(prep.checkpoint, extra_files=[], has_index=False))


def run_region(prep: Prepared, out_dir: str, layout: Layout,
               metadata: dict[str, dict[str, str]], region: Region, *, first_pass: bool,
               threads: int | None, roots: Sequence[str] | None
               ) -> tuple[int, int, ExecutionResult]:
    """Execute one region: (region index, this process's id, what it read and wrote)."""
    hooks().region_started(region.index)
    sub = region_prepared(prep, region)
    with confined(roots) if roots else contextlib.nullcontext():
        writer = CheckpointWriter(Path(out_dir), layout, metadata=metadata,
                                  region=(region.file, set(region.tensors)))
        result = execute(sub, Path(out_dir), threads=threads, compute_threads=1,
                         first_pass=first_pass, writer=writer)
    return region.index, os.getpid(), result


def combine(layout: Layout, regions: Sequence[Region], results: dict[int, ExecutionResult],
            exec_seconds: float) -> ExecutionResult:
    """One result from the regions': every tensor once, as its layout says; counters summed."""
    if set(results) != {r.index for r in regions}:
        raise RuntimeError(f"output regions {sorted(set(range(len(regions))) - set(results))} "
                           "returned no result")
    by_name = {}
    for reg in regions:
        res = results[reg.index]
        got = [t.name for t in res.tensors]
        if got != list(reg.tensors) or any(t.file != reg.file for t in res.tensors):
            raise RuntimeError(f"output region {reg.index} wrote tensors {got[:3]}.. of "
                               f"{reg.file}, not its own")
        by_name.update({t.name: t for t in res.tensors})
    tensors = _in_layout(layout, by_name)
    parts = list(results.values())
    fetched, by_model = _expert_counters(parts)
    passes = {k: v for r in parts for k, v in r.first_passes.items()}
    return ExecutionResult(tensors, output_hash(tensors), sum(r.expert_bytes_read for r in parts),
                           by_model, fetched, sum(r.base_bytes_read for r in parts),
                           sum(r.blocks_total for r in parts),
                           sum(r.expert_blocks_read for r in parts), exec_seconds, [], [],
                           passes, sum(r.kernel_copied_bytes for r in parts))


def _in_layout(layout: Layout, by_name: dict[str, OutputTensor]) -> list[OutputTensor]:
    """The output tensors in layout order, each checked against its layout entry."""
    tensors = []
    for fname, specs in layout:
        for name, dtype, shape in specs:
            t = by_name[name]
            if (t.dtype, tuple(t.shape), t.file) != (dtype, tuple(shape), fname):
                raise RuntimeError(f"output tensor {name!r} came back as {t.dtype} "
                                   f"{list(t.shape)} in {t.file}")
            tensors.append(t)
    return tensors


def _expert_counters(parts: list[ExecutionResult]
                     ) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The regions' expert fetch statistics and expert bytes by model, summed."""
    fetched: defaultdict[str, Counter[str]] = defaultdict(Counter)
    by_model: Counter[str] = Counter()
    for r in parts:
        for m, st in r.expert_fetch_by_model.items():
            fetched[m].update(st)
        by_model.update(r.expert_bytes_by_model)
    return {m: dict(c) for m, c in fetched.items()}, dict(by_model)
