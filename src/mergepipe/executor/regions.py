"""Output regions: a merge cut into runs of whole tensors of one file, each executed alone."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mergepipe.core.hooks import hooks
from mergepipe.core.vocab import DTYPE_SIZES
from mergepipe.executor.prepare import Prepared
from mergepipe.executor.stream import ExecutionResult, execute, output_hash
from mergepipe.executor.writer import CheckpointWriter, OutputTensor
from mergepipe.storage.fsconfine import confined

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


def create_files(out_dir: Path, layout: Layout, metadata: dict[str, dict[str, str]]) -> int:
    writer = CheckpointWriter(out_dir, layout, metadata=metadata)
    writer.abort()  # closes them: the regions write the data
    return writer.total_bytes


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
    fetched: dict[str, dict[str, int]] = {}
    by_model: dict[str, int] = {}
    for r in parts:
        for m, st in r.expert_fetch_by_model.items():
            acc = fetched.setdefault(m, {})
            for k, v in st.items():
                acc[k] = acc.get(k, 0) + v
        for m, n in r.expert_bytes_by_model.items():
            by_model[m] = by_model.get(m, 0) + n
    return fetched, by_model
