"""Entry points: queue a merge, run it (plan, execute, publish, record), merge in one call, replay."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.request import MergeRequest
from mergepipe.executor import manifest, publish, stream
from mergepipe.executor.model_card import CARD_FILE, render_model_card
from mergepipe.executor.stream import ExecutionResult, PlanLike, Prepared
from mergepipe.jobs.register import register_output, scan_output
from mergepipe.jobs.replay import replay as replay
from mergepipe.jobs.replay import request_from_dict

Progress = Callable[[dict[str, Any]], None]

__all__ = ["execute_plan", "merge", "new_merge", "replay", "run_merge"]


def new_merge(cat: Catalog, request: MergeRequest, output_name: str, output_dir: Path, *,
              overwrite: bool = False) -> str:
    """Record a merge as 'queued' and return its id; checks the output name and directory."""
    if not output_name or "/" in output_name:
        raise InvalidRequest(f"output name {output_name!r} must be a non-empty name without '/'",
                             field="output.name")
    target = Path(output_dir).absolute()
    publish.check_target(target, overwrite=overwrite)
    merge_id = manifest.new_merge_id()
    manifest.insert_queued(cat, merge_id, request, output_name, target)
    return merge_id


def run_merge(cat: Catalog, merge_id: str, *, progress: Progress | None = None,
              threads: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Plan, execute, publish (output + manifest.json atomically) and record a queued merge;
    on success the output is registered as a model. Returns the summary."""
    from mergepipe.planner.plan import make_plan

    wall0 = time.perf_counter()
    row = manifest.mark_running(cat, merge_id)
    target = Path(row["output_path"])
    name = str(row["output_name"])
    stage: Path | None = None
    published = False
    result: ExecutionResult | None = None
    try:
        request = request_from_dict(row["request"])
        t0 = time.perf_counter()
        plan = make_plan(cat, request)
        prep = stream.prepare(cat, plan)
        plan_seconds = time.perf_counter() - t0
        manifest.record_plan(cat, merge_id, prep, plan_seconds, len(prep.base.blocks))
        stage = publish.prepare(target, merge_id[2:], overwrite=overwrite)
        result = stream.execute(prep, stage, threads=threads,
                                progress=_progress_recorder(cat, merge_id, progress),
                                first_pass=True)
        manifest.write_manifest(stage, manifest.build_manifest(
            merge_id=merge_id, prep=prep, result=result, output_name=name, output_path=target,
            plan_seconds=plan_seconds, wall_seconds=time.perf_counter() - wall0))
        (stage / CARD_FILE).write_text(render_model_card(request.to_dict(), summary(
            merge_id, prep, result, output=target, output_name=name, plan_seconds=plan_seconds,
            wall_seconds=time.perf_counter() - wall0), name=name))
        publish.publish(stage, target, overwrite=overwrite)
        stage, published = None, True
        scanned = scan_output(cat, target, name, request.base, merge_id, result.first_passes)
        result.first_passes.clear()
        with cat.transaction() as conn:
            register_output(conn, scanned)
            manifest.record_success(conn, merge_id, request, name, target, result)
    except BaseException as e:
        if stage is not None:
            publish.discard(stage)
        if published:
            publish.discard(target)  # never an output without its catalog record
        msg = e.message if isinstance(e, MergePipeError) else f"{type(e).__name__}: {e}"
        if isinstance(e, KeyboardInterrupt):
            msg = "interrupted"
        manifest.record_failure(cat, merge_id, msg,
                                result.exec_seconds if result is not None else None)
        raise
    return summary(merge_id, prep, result, output=target, output_name=name,
                   plan_seconds=plan_seconds, wall_seconds=time.perf_counter() - wall0)


def merge(cat: Catalog, request: MergeRequest, output_dir: Path, *,
          output_name: str | None = None, progress: Progress | None = None,
          threads: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """new_merge + run_merge: the CLI's merge. The output name defaults to the directory name."""
    target = Path(output_dir).absolute()
    merge_id = new_merge(cat, request, output_name or target.name, target, overwrite=overwrite)
    return run_merge(cat, merge_id, progress=progress, threads=threads, overwrite=overwrite)


def execute_plan(cat: Catalog, plan: PlanLike, output_dir: Path, *,
                 threads: int | None = None, progress: Progress | None = None,
                 overwrite: bool = False) -> dict[str, Any]:
    """Execute any plan (e.g. a benchmark's random plan of equal bytes) into `output_dir`,
    atomically with its manifest.json; no catalog rows are written."""
    wall0 = time.perf_counter()
    target = Path(output_dir).absolute()
    prep = stream.prepare(cat, plan)
    tag = "x-" + manifest.new_merge_id()[2:]
    with publish.staged(target, tag, overwrite=overwrite) as stage:
        result = stream.execute(prep, stage, threads=threads, progress=progress)
        manifest.write_manifest(stage, manifest.build_manifest(
            merge_id=None, prep=prep, result=result, output_name=None, output_path=target,
            plan_seconds=None, wall_seconds=time.perf_counter() - wall0))
    return summary(None, prep, result, output=target, output_name=None, plan_seconds=None,
                   wall_seconds=time.perf_counter() - wall0)


def summary(merge_id: str | None, prep: Prepared, result: ExecutionResult, *, output: Path,
            output_name: str | None, plan_seconds: float | None,
            wall_seconds: float) -> dict[str, Any]:
    """The fields of DESIGN section 4 plus timings and per-expert I/O."""
    plan = prep.plan
    req = plan.request
    return manifest.jsonable({
        "merge_id": merge_id,
        "status": "succeeded",
        "plan_hash": plan.plan_hash,
        "operator": req.operator,
        **manifest.io_figures(prep, result),
        "output": str(output),
        "output_name": output_name,
        "output_hash": result.output_hash,
        "blocks_total": result.blocks_total,
        "expert_blocks_read": result.expert_blocks_read,
        "experts": [{"model": e.model, "planned_bytes": prep.planned_by_model[e.model],
                     "bytes_read": result.expert_bytes_by_model.get(e.model, 0)}
                    for e in req.experts],
        "plan_seconds": plan_seconds,
        "exec_seconds": result.exec_seconds,
        "wall_seconds": wall_seconds,
    })


def _progress_recorder(cat: Catalog, merge_id: str, user: Progress | None) -> Progress:
    """Record progress in the merges row (the executor calls it at most every 0.5 s)."""
    def report(info: dict[str, Any]) -> None:
        manifest.record_progress(cat, merge_id, info)
        if user is not None:
            user({"merge_id": merge_id, **info})
    return report
