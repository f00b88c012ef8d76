"""Replay: re-execute the plan a merge recorded and compare the output hashes with the stored ones."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Conflict
from mergepipe.core.jsonable import jsonable
from mergepipe.core.mergekit_slices import PASSTHROUGH, PassthroughRequest
from mergepipe.core.progress import ProgressFn
from mergepipe.core.request import MergeRequest
from mergepipe.executor import publish, stream
from mergepipe.executor.manifest import build_manifest, write_manifest
from mergepipe.jobs import slices
from mergepipe.planner.incremental import executed_request
from mergepipe.planner.plan import Plan


@dataclass(frozen=True)
class TensorCheck:
    tensor: str
    expected: str | None
    actual: str | None
    match: bool


@dataclass(frozen=True)
class ReplayResult:
    """Whether re-executing a merge's recorded plan gave its recorded output, tensor by tensor."""

    merge_id: str
    match: bool
    plan_hash: str
    expected_output_hash: str | None
    output_hash: str
    n_tensors: int
    mismatched_tensors: list[str]
    expert_bytes_read: int
    base_bytes_read: int
    budget_bytes: int
    output: str | None  # None: replayed into a temporary directory, since removed
    wall_seconds: float
    tensors: list[TensorCheck] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(jsonable(asdict(self)))


def stored_plan(cat: Catalog, merge_id: str) -> Plan:
    """The plan a merge recorded (request, plan document, access set), ready to execute."""
    row = records.get_merge(cat, merge_id)
    if row.plan_hash is None or row.plan is None:
        raise Conflict(f"merge {merge_id} was never planned (status {row.status}); nothing "
                       "to replay", field="merge_id")
    return Plan.from_document(executed_request(row.plan, MergeRequest.from_dict(row.request)),
                              row.plan,
                              records.touched_blocks(cat, merge_id))


def replay(cat: Catalog, merge_id: str, output_dir: Path | None = None, *,
           threads: int | None = None, progress: ProgressFn | None = None) -> ReplayResult:
    """Re-run the stored access set (a passthrough merge: copy the slices again, every source
    file read at the version recorded) into `output_dir` (default: a temporary directory) and
    report, per tensor, whether the output hash matches the stored one."""
    t0 = time.perf_counter()
    row = records.get_merge(cat, merge_id)
    if row.status != "succeeded":
        raise Conflict(f"merge {merge_id} is {row.status}; only succeeded merges can be "
                       "replayed", field="merge_id")
    copied = row.operator == PASSTHROUGH
    if copied:
        if row.plan is None or row.plan_hash is None:
            raise Conflict(f"merge {merge_id} was never planned; nothing to replay",
                           field="merge_id")
        copy = slices.PassthroughPlan.from_document(PassthroughRequest.from_dict(row.request),
                                                    row.plan)
        plan_hash, budget = copy.plan_hash, 0
    else:
        plan = stored_plan(cat, merge_id)
        prep = stream.prepare(cat, plan)
        plan_hash, budget = plan.plan_hash, plan.budget_bytes
    expected = records.output_tensors(cat, merge_id)
    tmp_root: Path | None = None  # a temporary folder, removed afterwards
    if output_dir is None:
        tmp_root = Path(tempfile.mkdtemp(prefix=f"mergepipe-replay-{merge_id}-"))
        output_dir = tmp_root / "output"
    target = Path(output_dir).absolute()
    try:
        with publish.staged(target, f"replay-{merge_id[2:]}") as stage:
            if copied:
                done = slices.execute(copy, stage)
                write_manifest(stage, slices.manifest(
                    copy, done, merge_id=merge_id, output_name=None, output_path=str(target),
                    plan_seconds=None, wall_seconds=None))
                written, output_hash, read = done.written, done.output_hash, (0, done.bytes_read)
            else:
                result = stream.execute(prep, stage, threads=threads, progress=progress)
                manifest = build_manifest(cat, merge_id=merge_id, prep=prep, result=result,
                                          output_name=None, output_path=target,
                                          plan_seconds=None)
                tokenizer = (row.plan or {}).get("tokenizer")
                if tokenizer is not None:  # the config's tokenizer options, redone
                    from mergepipe.jobs.reindex import TokenizerStep  # torch: only for them
                    from mergepipe.jobs.tokenizer import TokenizerPlan

                    step = TokenizerStep(TokenizerPlan.from_document(tokenizer), plan.request)
                    manifest = {**manifest, "tokenizer": step(stage, result)}
                write_manifest(stage, manifest)
                written, output_hash = result.tensors, result.output_hash
                read = (result.expert_bytes_read, result.base_bytes_read)
    finally:
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    actual = {t.name: t.content_hash for t in written}
    checks = [TensorCheck(n, expected.get(n), actual.get(n), expected.get(n) == actual.get(n))
              for n in sorted(expected.keys() | actual.keys())]
    mismatches = [c.tensor for c in checks if not c.match]
    return ReplayResult(
        merge_id=merge_id, match=not mismatches and output_hash == row.output_hash,
        plan_hash=plan_hash, expected_output_hash=row.output_hash, output_hash=output_hash,
        n_tensors=len(checks), mismatched_tensors=mismatches, expert_bytes_read=read[0],
        base_bytes_read=read[1], budget_bytes=budget,
        output=None if tmp_root is not None else str(target),
        wall_seconds=time.perf_counter() - t0, tensors=checks)
