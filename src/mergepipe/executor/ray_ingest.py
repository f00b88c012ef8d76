"""Ingestion statistics on Ray: one task per shard file of a checkpoint, the rows written here."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mergepipe.catalog.ingest import ScanFn
from mergepipe.catalog.scan import TensorPlan, TensorResult, scan_pinned
from mergepipe.core.hooks import hooks
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.executor.ray_engine import RAY_TASK_RETRIES, RUNTIME, as_finished
from mergepipe.storage.fsconfine import confined, current_roots
from mergepipe.storage.store_types import Stamp

log = logging.getLogger("mergepipe.executor.ray_ingest")


@dataclass(frozen=True)
class ShardScan:
    """What one shard's task returns: its tensors' results (in its plans' order)."""

    index: int  # the shard's position among the checkpoint's shard files
    pid: int  # the worker process that scanned it
    results: list[TensorResult]
    bytes_read: int


def ray_scan(address: str | None) -> ScanFn:
    return functools.partial(scan_on_ray, address=address)


def shard_groups(plans: Sequence[TensorPlan]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for k, p in enumerate(plans):
        groups.setdefault(p.entry.file, []).append(k)
    return list(groups.values())


def scan_on_ray(plans: list[TensorPlan], pins: list[tuple[str, Stamp]],
                progress: ProgressFn | None, *, address: str | None
                ) -> tuple[list[TensorResult], int]:
    """catalog.scan.scan_pinned's results, one Ray task per shard file."""
    groups = shard_groups(plans)
    if len(groups) < 2:
        return scan_pinned(plans, pins, progress)
    ray = RUNTIME.acquire(address)
    try:
        task = ray.remote(num_cpus=1, max_retries=RAY_TASK_RETRIES,
                          retry_exceptions=False)(scan_shard)
        roots = current_roots()
        pending = [task.remote(i, [plans[k] for k in g], pins, roots)
                   for i, g in enumerate(groups)]
        # the blocks tile each tensor: their bytes in all are the tensor's
        shards = _gather(ray, pending, [sum(plans[k].entry.nbytes for k in g) for g in groups],
                         progress)
    finally:
        RUNTIME.release()
    results: list[TensorResult | None] = [None] * len(plans)
    for i, g in enumerate(groups):
        got = shards[i].results
        if [r.name for r in got] != [plans[k].name for k in g]:
            raise RuntimeError(f"ingestion shard {i} returned tensors {[r.name for r in got][:3]}"
                               f".. not its own")
        for k, r in zip(g, got, strict=True):
            results[k] = r
    return [r for r in results if r is not None], sum(s.bytes_read for s in shards.values())


def scan_shard(index: int, plans: list[TensorPlan], pins: list[tuple[str, Stamp]],
               roots: Sequence[str] | None) -> ShardScan:
    """One shard's scan, in any process that sees the checkpoint at the same paths."""
    hooks().shard_started(index)
    with confined(roots) if roots else contextlib.nullcontext():
        results, nbytes = scan_pinned(plans, pins, None, workers=1)
    return ShardScan(index, os.getpid(), results, nbytes)


def _gather(ray: Any, pending: list[Any], sizes: list[int], progress: ProgressFn | None
            ) -> dict[int, ShardScan]:
    """The shards' scans as they finish, with progress in bytes after each."""
    shards: dict[int, ShardScan] = {}
    done, total = 0, sum(sizes)
    for shard in as_finished(ray, pending):
        shards[shard.index] = shard
        log.debug("ingestion shard %d of %d scanned by process %d", shard.index + 1,
                  len(sizes), shard.pid)
        done += sizes[shard.index]
        if progress is not None:
            progress(Progress(done, total, "bytes"))
    return shards
