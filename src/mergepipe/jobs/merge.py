"""One merge end to end: validated and queued when accepted (4xx then, for the caller); planned
once by the worker that runs it, against the catalog as it is then (a merge queued behind the
ingestion of its inputs cannot be planned earlier), the plan recorded before any weight is read
(replay re-executes that record); then executed, published, recorded and registered."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from mergepipe.catalog import records
from mergepipe.catalog.connection import Connection
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.fence import Fence, LeaseLost, check_not_cancelled, hold
from mergepipe.catalog.ingest import scan_model, write_model
from mergepipe.catalog.models import find_model, find_models
from mergepipe.catalog.queue import NewIngestJob, NewMerge, Queued, enqueue
from mergepipe.catalog.records import OutcomeRecord
from mergepipe.catalog.scan import FirstPass
from mergepipe.core.errors import InvalidRequest, MergePipeError, failure_message
from mergepipe.core.hooks import hooks
from mergepipe.core.mergekit_slices import PASSTHROUGH, PassthroughRequest
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.request import MergeRequest
from mergepipe.core.vocab import check_name
from mergepipe.executor import publish, stream
from mergepipe.executor.engine import LOCAL, Engine
from mergepipe.executor.manifest import build_manifest, io_figures, write_manifest
from mergepipe.executor.model_card import CARD_FILE, hub_ids, render_model_card
from mergepipe.executor.publish import LocalOutput, S3Output, output_for
from mergepipe.executor.stream import ExecutionResult, Prepared
from mergepipe.jobs import slices
from mergepipe.jobs.planning import check_inputs, check_vocab_rows
from mergepipe.jobs.report import MergeSummary, outcome_record, plan_record, summary
from mergepipe.jobs.space import check_space, out_of_space_is_507
from mergepipe.planner.incremental import choose_plan, previous_of, strategy_of, user_request
from mergepipe.planner.plan import Plan, base_content
from mergepipe.storage.fsconfine import confined
from mergepipe.storage.locations import basename, is_url
from mergepipe.storage.paths import recheck_input

__all__ = ["execute_plan", "merge", "plan_and_prepare", "run_merge", "submit_merge"]


class Finish(Protocol):
    """A last step on the staged output before its manifest (jobs.reindex.TokenizerStep). What
    it returns is recorded in the manifest under "tokenizer" (with "resized": true, the output
    is registered as a model of its own, not an expert of the base); its document() with the
    plan, for replay; `reindexes`: whether it re-indexes the embeddings (then experts with more
    vocabulary rows than the base may be merged: jobs.planning.check_vocab_rows)."""

    def __call__(self, stage: Path, result: ExecutionResult) -> Mapping[str, object]: ...

    def document(self) -> dict[str, Any]: ...

    @property
    def reindexes(self) -> bool: ...


def submit_merge(cat: Catalog, request: MergeRequest | PassthroughRequest, output_name: str,
                 output_dir: Path | str, *,
                 overwrite: bool = False, ingests: Sequence[NewIngestJob] = (),
                 max_queued: int | None = None,
                 tokenizer: Mapping[str, Any] | None = None) -> Queued:
    """Check the request against the catalog and the output (a passthrough request was checked
    when jobs.slices resolved it), and queue the merge with the ingestions of its unregistered
    inputs, in one transaction. `tokenizer`: a config's tokenizer plan (its document), queued
    under the request's "tokenizer" and run as the merge's finish (jobs.reindex.queued_step)."""
    check_name(output_name, "output.name")  # it becomes a model: the name rule of ingestion
    out = output_for(output_dir)
    out.check(overwrite=overwrite)
    if tokenizer is not None and not (isinstance(out, LocalOutput)
                                      and isinstance(request, MergeRequest)):
        raise InvalidRequest("tokenizer: the tokenizer options write files into a local "
                             "output directory, after a merge (not a layer copy)",
                             field="tokenizer")
    if isinstance(request, MergeRequest):
        request = check_inputs(cat, request, pending={j.model for j in ingests})
        if isinstance(out, LocalOutput):
            check_space(cat, request, out.path)
    return enqueue(cat, ingests=ingests, merge=NewMerge(request, output_name, out.location,
                                                        replace=overwrite, tokenizer=tokenizer),
                   max_queued=max_queued)


def run_merge(cat: Catalog, merge_id: str, *, progress: ProgressFn | None = None,
              threads: int | None = None, overwrite: bool = False,
              data_roots: Sequence[Path] = (), output_root: Path | None = None,
              engine: Engine = LOCAL, fence: Fence | None = None,
              finish: Finish | None = None) -> MergeSummary:
    """Plan, record the plan, execute, publish (output + manifest.json atomically), register the
    output as a model and record success; any failure is recorded once and raised. With data
    roots (the service), the inputs must still lie inside them, every input file opened beneath
    its root (the data roots, and the output root for earlier outputs). `fence` (a worker on a
    shared catalog): every write is made only while its lease holds (docs/scale-out.md)."""
    roots = [*data_roots, *([output_root] if output_root is not None else [])]
    with confined(roots) if data_roots else contextlib.nullcontext():
        wall0 = time.perf_counter()
        row = records.mark_running(cat, merge_id, fence)
        out, name = output_for(str(row.output_path)), str(row.output_name)
        copy = PassthroughRequest.from_dict(row.request) if row.operator == PASSTHROUGH else None
        ran: list[float] = []  # a passthrough's execution seconds, recorded with a failure
        try:
            if copy is not None:
                return _run_passthrough(cat, merge_id, copy, out, name, wall0, ran,
                                        overwrite=overwrite, fence=fence, data_roots=data_roots,
                                        progress=progress)
            request = MergeRequest.from_dict(row.request)
            if data_roots:
                _recheck_inputs(cat, request, data_roots)
            t0 = time.perf_counter()
            prep = plan_and_prepare(cat, request,
                                    vocab=finish is None or not finish.reindexes)
            plan_seconds = time.perf_counter() - t0
            record = plan_record(prep, plan_seconds)
            if finish is not None:
                record = replace(record, document={**record.document,
                                                   "tokenizer": finish.document()})
            records.record_plan(cat, merge_id, record, fence)
            previous = previous_of(prep.plan)
            records.record_strategy(cat, merge_id, strategy_of(prep.plan),
                                    previous[0] if previous else None, fence)
            result = _execute_and_publish(cat, merge_id, prep, out, name, plan_seconds, wall0,
                                          progress=progress, threads=threads,
                                          overwrite=overwrite, engine=engine, fence=fence,
                                          finish=finish)
        except LeaseLost:
            raise  # another worker owns the merge now: record nothing
        except BaseException as e:
            records.record_failure(cat, merge_id, failure_message(e, "merge"),
                                   ran[0] if ran else None, fence)
            raise
        return summary(merge_id, prep, result, output=out.location, output_name=name,
                       plan_seconds=plan_seconds, wall_seconds=time.perf_counter() - wall0)


def _run_passthrough(cat: Catalog, merge_id: str, request: PassthroughRequest,
                     out: LocalOutput | S3Output, name: str, wall0: float, ran: list[float], *,
                     overwrite: bool, fence: Fence | None, data_roots: Sequence[Path],
                     progress: ProgressFn | None) -> MergeSummary:
    """A passthrough merge (jobs.slices), recorded and published as every merge is; the output
    registered as a base model."""
    for key, path in request.sources.items():
        if data_roots and not is_url(path):
            recheck_input(path, data_roots, field=key)
    t0 = time.perf_counter()
    plan = slices.plan_passthrough(request)
    plan_seconds = time.perf_counter() - t0
    records.record_plan(cat, merge_id, slices.plan_record(plan, plan_seconds), fence)
    records.record_strategy(cat, merge_id, "scratch", None, fence)
    stage = out.stage(merge_id[2:] + (fence.tag if fence else ""), overwrite=overwrite)
    try:
        with out_of_space_is_507(stage):
            result = slices.execute(plan, stage, _recorder(cat, merge_id, progress, fence))
            ran.append(result.exec_seconds)
            hooks().merge_staged(merge_id)
            write_manifest(stage, slices.manifest(
                plan, result, merge_id=merge_id, output_name=name, output_path=out.location,
                plan_seconds=plan_seconds, wall_seconds=time.perf_counter() - wall0))
    except BaseException:
        publish.discard(stage)
        raise
    publish_and_record(cat, merge_id, stage, out, name, base=None, first_passes={},
                       outcome=lambda registered: slices.outcome_record(
                           plan, result, registered, out.location),
                       overwrite=overwrite, fence=fence)
    return slices.summary(merge_id, plan, result, output=out.location, output_name=name,
                          plan_seconds=plan_seconds, wall_seconds=time.perf_counter() - wall0)


def plan_and_prepare(cat: Catalog, request: MergeRequest, *, vocab: bool = True) -> Prepared:
    """Plan by the request's strategy and check the plan against the catalog and the files
    (what a merge reports as plan_seconds). What the plan does not change is read on a second
    connection while the planner runs: the models' catalog rows, with check_vocab_rows
    (`vocab`) on them, and the base's content digest (into the planner's cache). The
    vocabulary check's refusal comes first, as if it had run before planning; with auto (asked
    for: never the default), an incremental plan whose stored merge cannot be read any more
    (moved, changed) falls back to scratch, saying why in the plan."""
    def read() -> tuple[stream.Inputs, InvalidRequest | None]:
        inputs = stream.read_inputs(cat, [request.base, *(e.model for e in request.experts)])
        base = inputs.rows[request.base]
        with cat.reader() as conn:  # the plan hash's, cached for the planner
            base_content(cat, conn, base.name, base.created_at)
        try:
            if vocab:
                check_vocab_rows(request, inputs)
        except InvalidRequest as refusal:
            return inputs, refusal
        return inputs, None

    with ThreadPoolExecutor(1, thread_name_prefix="mergepipe-inputs") as pool:
        beside = pool.submit(contextvars.copy_context().run, read)  # within the confinement
        try:
            plan = choose_plan(cat, request)
        except MergePipeError:
            refusal = _refusal(beside)
            if refusal is not None:
                raise refusal from None
            raise
        inputs, refusal = beside.result()
    if refusal is not None:
        raise refusal
    try:
        return stream.prepare(cat, plan, inputs)
    except MergePipeError as e:
        previous = previous_of(plan)
        if request.strategy != "auto" or previous is None:
            raise
        why = f"merge {previous[0]}'s output {previous[1]!r} cannot be read: {e}"
    plan = choose_plan(cat, replace(request, strategy="scratch"))
    plan.request = request
    assert plan.strategy is not None
    plan.strategy.update(requested="auto", incremental={"available": False, "reason": why})
    return stream.prepare(cat, plan, inputs)


def _refusal(beside: Future[tuple[stream.Inputs, InvalidRequest | None]]
             ) -> InvalidRequest | None:
    """The vocabulary check's refusal, once the reads beside a plan that failed end; None if
    they failed before it (the planner's error is raised then, as before they ran beside)."""
    try:
        return beside.result()[1]
    except Exception:
        return None


def _execute_and_publish(cat: Catalog, merge_id: str, prep: Prepared,
                         out: LocalOutput | S3Output, name: str,
                         plan_seconds: float, wall0: float, *, progress: ProgressFn | None,
                         threads: int | None, overwrite: bool, engine: Engine,
                         fence: Fence | None, finish: Finish | None = None) -> ExecutionResult:
    """Execute into a staging directory (then `finish` on it), then publish_and_record it."""
    stage = out.stage(merge_id[2:] + (fence.tag if fence else ""), overwrite=overwrite)
    finished: Mapping[str, object] | None = None
    try:
        with out_of_space_is_507(stage):
            result = engine.execute(prep, stage, threads=threads, first_pass=True,
                                    progress=_recorder(cat, merge_id, progress, fence))
            hooks().merge_staged(merge_id)
            finished = finish(stage, result) if finish is not None else None
            manifest = build_manifest(
                cat, merge_id=merge_id, prep=prep, result=result, output_name=name,
                output_path=out.location, plan_seconds=plan_seconds,
                wall_seconds=time.perf_counter() - wall0)
            write_manifest(stage, {**manifest, "tokenizer": dict(finished)}
                           if finished is not None else manifest)
            shown = user_request(prep.plan)
            inputs = find_models(cat, [shown.base, *(e.model for e in shown.experts)])
            (stage / CARD_FILE).write_text(render_model_card(
                shown, io_figures(prep, result), name=name, merge_id=merge_id,
                plan_hash=prep.plan.plan_hash, hub_ids=hub_ids(inputs.values())))
    except BaseException:
        publish.discard(stage)  # this run's own staging (per claim with a fence)
        raise
    # an output whose embeddings gained or lost rows is no expert of the base
    resized = finished is not None and bool(finished.get("resized"))
    publish_and_record(cat, merge_id, stage, out, name,
                       base=None if resized else prep.plan.request.base,
                       first_passes=result.first_passes,
                       outcome=lambda registered: outcome_record(prep, result, registered,
                                                                 out.location),
                       overwrite=overwrite, fence=fence)
    return result


def publish_and_record(cat: Catalog, merge_id: str, stage: Path, out: LocalOutput | S3Output,
                       name: str, *, base: str | None, first_passes: dict[str, FirstPass],
                       outcome: Callable[[str], OutcomeRecord], overwrite: bool,
                       fence: Fence | None) -> None:
    """Publish the staged output, then register it as model `name` (an expert of `base` with
    statistics, or a base model) and record the merge's outcome in one transaction: an output
    is never left published without its record. With a fence, the merge's row stays locked
    from before the publish to the record (a run whose merge was taken over publishes nothing)."""
    published = False
    try:
        with _fenced(cat, merge_id, fence) as held:
            with contextlib.nullcontext(held) if held else cat.reader() as conn:
                check_not_cancelled(conn, merge_id)  # cancelled: publish nothing
            out.publish(stage, overwrite=overwrite)
            published = True
            scanned = scan_model(cat, out.location, name, base=base, kind="full",
                                 with_stats=base is not None, source_merge=merge_id,
                                 first_passes=first_passes,
                                 force=True)  # what was asked: its norm is shown, not judged
            first_passes.clear()
            with contextlib.nullcontext(held) if held else cat.transaction() as conn:
                write_model(conn, scanned, replace=overwrite)
                records.record_success(conn, merge_id, outcome(scanned.name))
    except BaseException:
        if not published:
            publish.discard(stage)
        else:
            with _fenced(cat, merge_id, fence):  # lease lost: the output may be the new owner's
                out.discard()
        raise


@contextlib.contextmanager
def _fenced(cat: Catalog, merge_id: str, fence: Fence | None
            ) -> Iterator[Connection | None]:
    """No fence: nothing (None). A fence: a transaction holding it (LeaseLost if lost), the
    merge's row locked until the block ends (committed then, rolled back on an error)."""
    if fence is None:
        yield None
        return
    with cat.transaction() as conn:
        hold(conn, merge_id, fence)
        yield conn


def merge(cat: Catalog, request: MergeRequest | PassthroughRequest, output_dir: Path | str, *,
          output_name: str | None = None, progress: ProgressFn | None = None,
          threads: int | None = None, overwrite: bool = False,
          engine: Engine = LOCAL, finish: Finish | None = None) -> MergeSummary:
    """submit_merge + run_merge: the CLI's merge into a directory or an s3:// prefix (the
    output named after it by default)."""
    out = output_for(output_dir)
    merge_id = submit_merge(cat, request, output_name or basename(out.location), out.location,
                            overwrite=overwrite).merge_id
    assert merge_id is not None
    return run_merge(cat, merge_id, progress=progress, threads=threads, overwrite=overwrite,
                     engine=engine, finish=finish)


def execute_plan(cat: Catalog, plan: Plan, output_dir: Path, *, threads: int | None = None,
                 progress: ProgressFn | None = None, overwrite: bool = False,
                 engine: Engine = LOCAL) -> MergeSummary:
    """Execute any plan (e.g. a benchmark's random plan of equal bytes) into `output_dir`,
    atomically with its manifest.json; no catalog rows are written."""
    wall0 = time.perf_counter()
    target = Path(output_dir).absolute()
    prep = stream.prepare(cat, plan)
    tag = "x-" + records.new_merge_id()[2:]
    with (publish.staged(target, tag, overwrite=overwrite) as stage,
          out_of_space_is_507(stage)):
        result = engine.execute(prep, stage, threads=threads, progress=progress)
        write_manifest(stage, build_manifest(
            cat, merge_id=None, prep=prep, result=result, output_name=None, output_path=target,
            plan_seconds=None, wall_seconds=time.perf_counter() - wall0))
    return summary(None, prep, result, output=target, output_name=None, plan_seconds=None,
                   wall_seconds=time.perf_counter() - wall0)


def _recheck_inputs(cat: Catalog, request: MergeRequest, data_roots: Sequence[Path]) -> None:
    """The directories of the merge's models still hold no link out of the data roots."""
    fields = [("base", request.base)] + [(f"experts[{i}].model", e.model)
                                         for i, e in enumerate(request.experts)]
    for field_name, name in fields:
        m = find_model(cat, name)
        if m is not None:
            recheck_input(m.path, data_roots, field=field_name)


def _recorder(cat: Catalog, merge_id: str, user: ProgressFn | None,
              fence: Fence | None) -> ProgressFn:
    """Record progress in the merges row; a lost lease stops the run there."""
    def report(p: Progress) -> None:
        records.record_progress(cat, merge_id, p, fence)
        if user is not None:
            user(p)
    return report
