"""The Python API: `mergepipe.Catalog`, the operations of the CLI and the service from a script
or a notebook, returning typed results and raising `mergepipe.MergePipeError` subclasses.

    import mergepipe
    with mergepipe.Catalog("family.duckdb") as cat:
        cat.ingest("ckpt/base", "base")
        cat.ingest("ckpt/math", "math", base="base")
        result = cat.merge(base="base", experts=["math"], operator="ties",
                           params={"density": 0.5}, budget=0.3, out="out/ties-30")
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.progress import Progress, ProgressFn
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.core.settings import Settings
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.core.vocab import normalize_dtype

if TYPE_CHECKING:  # the catalog opens with a Catalog (the CLI builds requests first, while
    # torch loads); the executor, the planner and torch load with the first merge or plan
    from mergepipe.catalog.calibrations import CalibrationRow
    from mergepipe.catalog.db import Catalog as CatalogDatabase
    from mergepipe.catalog.models import ModelRow
    from mergepipe.catalog.records import LineageEdge, MergeRow
    from mergepipe.core.mergekit_slices import PassthroughRequest
    from mergepipe.evaluation.compare import Comparison
    from mergepipe.executor.engine import Engine
    from mergepipe.jobs.lifecycle import Removal
    from mergepipe.jobs.replay import ReplayResult
    from mergepipe.jobs.report import MergeSummary
    from mergepipe.jobs.tokenizer import TokenizerPlan
    from mergepipe.planner.plan import Plan

__all__ = ["Catalog", "Lineage", "SqlResult"]


@dataclass(frozen=True)
class SqlResult:
    """A read-only query's result: column names, rows, and whether rows were cut at the limit."""

    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False


@dataclass(frozen=True)
class Lineage:
    """A model's ancestors and descendants, each edge with its depth from the model."""

    ancestors: list[LineageEdge]
    descendants: list[LineageEdge]


class Catalog:
    """A MergePipe catalog: a DuckDB file (created on first use) or a `postgresql://` URL.

    Without `location`, $MERGEPIPE_CATALOG, else ./mergepipe.duckdb. The settings (data roots,
    SQL limits, engine) come from the environment unless given. Use it as a context manager,
    or call close().

    The CLI's commands are methods of this class too (cli/commands/), and the service's routes
    call the same job functions these methods call: one implementation per operation."""

    def __init__(self, location: str | Path | None = None, *,
                 settings: Settings | None = None) -> None:
        s = settings or Settings.from_env()
        if location is not None:
            s = replace(s, catalog=Settings.from_env({}, catalog=str(location)).catalog)
        from mergepipe.catalog.db import Catalog as CatalogDatabase

        self.settings = s
        self.db = CatalogDatabase(s.catalog)
        self._owned = True

    @classmethod
    def over(cls, db: CatalogDatabase, settings: Settings) -> Catalog:
        """A Catalog over a database that is already open (a server's, for a CLI command
        relayed to it): close() leaves the database open."""
        self = cls.__new__(cls)
        self.settings, self.db, self._owned = settings, db, False
        return self

    def close(self) -> None:
        if self._owned:
            self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- models -----------------------------------------------------------------------------
    def ingest(self, path: str | Path, name: str, *, base: str | None = None,
               kind: str = "full", block_bytes: int | None = None, stats: bool = True,
               progress: bool | ProgressFn = True, force: bool = False) -> ModelRow:
        """Register a checkpoint (a directory, a .safetensors file or an s3:// / https:// URL)
        as `name`; with `base`, an expert of that base with delta statistics. `force`: even
        when its delta is far larger than a fine-tune's (docs/catalog.md)."""
        from mergepipe.catalog.queue import NewIngestJob
        from mergepipe.jobs.ingest import run_ingestion

        job = NewIngestJob(name, kind, str(path), base, block_bytes, stats, force=force)
        with _bars(progress, f"ingesting {name}", unit="B", model=name) as report:
            return run_ingestion(self.db, job, progress=report, engine=self._engine())

    def models(self) -> list[ModelRow]:
        """Every registered model, as `mergepipe models` lists them."""
        from mergepipe.catalog.models import list_models

        return list_models(self.db)

    def remove(self, name: str, *, force: bool = False, delete_files: bool = False
               ) -> Removal:
        """Retire model `name` (`name~N`: one version) as `mergepipe rm` does: Conflict naming
        its dependants unless `force`; `delete_files` deletes retired merge outputs under the
        output root, nothing else (docs/lifecycle.md)."""
        from mergepipe.jobs.lifecycle import remove_model

        return remove_model(self.db, name, force=force, delete_files=delete_files,
                            output_root=Path(self.settings.output_root).absolute())

    def remove_merge(self, merge_id: str) -> MergeRow:
        """Cancel a queued or running merge, or retire a finished one; its row after."""
        from mergepipe.jobs.lifecycle import remove_merge

        return remove_merge(self.db, merge_id)

    def model(self, name: str) -> ModelRow:
        """One model: a name's latest version, or `name~N` that version (docs/lifecycle.md);
        NotFound when no model has that name."""
        from mergepipe.catalog.lifecycle import resolve_key
        from mergepipe.catalog.models import get_model

        return get_model(self.db, resolve_key(self.db, name))

    def calibrate(self, base: str, text: str | Path, *, tokens: int | None = None
                  ) -> CalibrationRow:
        """Run the registered base `base` on CPU over a calibration text (a str, or a Path to
        a UTF-8 file) and store its input-channel RMS per linear weight, as `mergepipe
        calibrate` does; plans with params={"utility": "activation"} then rank with the
        base's newest calibration. Needs the `eval` extra (transformers)."""
        from mergepipe.evaluation.calibration import DEFAULT_TOKENS, calibrate

        body = read_text(text, "calibration text") if isinstance(text, Path) else text
        return calibrate(self.db, base, body, tokens or DEFAULT_TOKENS)

    # -- plans and merges -------------------------------------------------------------------
    @staticmethod
    def request(*, base: str,
                experts: str | Sequence[str | tuple[str, float] | dict[str, Any]],
                operator: str, params: dict[str, Any] | None = None,
                budget: float | int | str | None = None, seed: int = 0,
                dtype: str | None = None, strategy: str | None = None) -> MergeRequest:
        """A validated merge request. `experts`: names, (name, weight) pairs, dicts of the
        HTTP API ({"model", "weight", "density"}) or the CLI's 'a,b:0.5' text; `budget`: a fraction of the full read (0.3), bytes (int) or '2GiB'."""
        return build_request(base=base, experts=_experts(experts), operator=operator,
                             params=params or {}, budget=_budget_text(budget), seed=seed,
                             output_dtype=dtype, strategy=strategy)

    def config(self, config: str | Path | dict[str, Any], *,
               budget: float | int | str | None = None, seed: int = 0,
               dtype: str | None = None, progress: bool | ProgressFn = True,
               cwd: str | Path | None = None,
               report: Callable[[str], None] | None = None) -> MergeRequest:
        """The budgeted request of a mergekit config (a path, the YAML text or its dict), to
        plan it or merge it; local checkpoints it names that are not registered yet are
        ingested first. Relative paths in it are relative to `cwd` (default: the working
        directory); `report` receives one line per checkpoint registered and per note on how
        the config was read. merge() takes the config itself too, including what has no
        budgeted request: a passthrough config, and tokenizer options that write files."""
        text, where = _config_text(config)
        request, tokenizer = self._config(text, where, budget=budget, seed=seed, dtype=dtype,
                                          progress=progress, cwd=cwd, report=report)
        if tokenizer is not None:
            raise InvalidRequest("tokenizer: the config's tokenizer options (chat_template, "
                                 "another model's tokenizer) write tokenizer files: merge the "
                                 "config itself with Catalog.merge(config, out=...)",
                                 field="tokenizer")
        return request

    def _config(self, text: str, where: str, *, budget: float | int | str | None, seed: int,
                dtype: str | None, progress: bool | ProgressFn, cwd: str | Path | None,
                report: Callable[[str], None] | None
                ) -> tuple[MergeRequest, TokenizerPlan | None]:
        """config(), with the output's tokenizer files its options ask for (None: the base's,
        which every merge copies)."""
        from mergepipe.jobs.config import load_config
        from mergepipe.jobs.ingest import run_ingestion

        tell = report or (lambda line: None)
        with _named(where):
            request, resolved = load_config(self.db, text, budget=_budget_text(budget),
                                            seed=seed, locate=_locate(cwd))
            for job in resolved.to_ingest:
                with (_bars(progress, f"ingesting {job.model}", unit="B", model=job.model) as bar,
                      _named(job.field, job.field)):
                    run_ingestion(self.db, job, progress=bar)
                role = ("as the base" if job.base is None else
                        f"as an expert of {job.base!r}, with delta statistics")
                tell(f"registered {job.model!r} in the catalog {role}")
        for note in resolved.config.notes:
            tell(f"note: {note}")
        if dtype:
            request = replace(request, output_dtype=normalize_dtype(dtype, "output_dtype"))
        return request, resolved.tokenizer

    def _passthrough(self, text: str, where: str, *, dtype: str | None, seed: int,
                     cwd: str | Path | None, report: Callable[[str], None] | None
                     ) -> tuple[PassthroughRequest, TokenizerPlan | None] | None:
        """The passthrough request of a config and its tokenizer files (None: another method)."""
        from mergepipe.jobs import slices
        from mergepipe.jobs.config import load_passthrough

        with _named(where):
            request = load_passthrough(self.db, text, locate=_locate(cwd), seed=seed,
                                       dtype=None if dtype is None else
                                       normalize_dtype(dtype, "output_dtype"))
            if request is None:
                return None
            tokenizer = slices.tokenizer_plan(text, request)
        for note in request.slice_config.notes:
            (report or (lambda line: None))(f"note: {note}")
        return request, tokenizer

    def plan(self, request: MergeRequest | str | Path | dict[str, Any] | None = None, *,
             target_deviation: float | None = None, cwd: str | Path | None = None,
             report: Callable[[str], None] | None = None, progress: bool | ProgressFn = True,
             **fields: Any) -> Plan:
        """Plan a merge without running it: the request, the fields of request(), or a
        mergekit config (as merge() takes it; `budget`, `seed`, `dtype` and `strategy` on top).
        `target_deviation` (instead of a budget): the smallest budget, in steps of 0.01 of the
        full read, whose predicted deviation is at most it (docs/deviation.md); the plan's
        `budget_search` says how it was found."""
        from mergepipe.jobs.planning import plan_merge

        req, _ = self._request_of(request, fields, progress=progress, cwd=cwd, report=report)
        target = _target(target_deviation, fields)
        if target is None:
            return plan_merge(self.db, req)
        return self.for_deviation(req, target)[1]

    def _request_of(self, request: MergeRequest | str | Path | dict[str, Any] | None,
                    fields: dict[str, Any], *, progress: bool | ProgressFn,
                    cwd: str | Path | None, report: Callable[[str], None] | None
                    ) -> tuple[MergeRequest, TokenizerPlan | None]:
        """The request of a MergeRequest, of request()'s fields or of a config (and its
        tokenizer plan)."""
        if request is None or isinstance(request, MergeRequest):
            return request or self.request(**fields), None
        _config_fields(fields)
        text, where = _config_text(request)
        req, tokenizer = self._config(text, where, budget=fields.get("budget"),
                                      seed=int(fields.get("seed") or 0),
                                      dtype=fields.get("dtype"), progress=progress, cwd=cwd,
                                      report=report)
        if fields.get("strategy"):
            req = replace(req, strategy=fields["strategy"])
        return req, tokenizer

    def for_deviation(self, request: MergeRequest, target_deviation: float
                      ) -> tuple[MergeRequest, Plan]:
        """The request with the smallest budget whose predicted deviation is at most
        `target_deviation`, and its plan (`budget_search` says how it was found)."""
        from mergepipe.jobs.planning import plan_for_deviation

        target = _target(target_deviation, {})
        if target is None:
            raise InvalidRequest("target_deviation is required", field="target_deviation")
        req, plan, _ = plan_for_deviation(self.db, request, target)
        return req, plan

    def merge(self, request: MergeRequest | str | Path | dict[str, Any] | None = None, *,
              out: str | Path, name: str | None = None, overwrite: bool = False,
              threads: int | None = None, progress: bool | ProgressFn = True,
              target_deviation: float | None = None, cwd: str | Path | None = None,
              report: Callable[[str], None] | None = None, **fields: Any) -> MergeSummary:
        """Plan, execute and publish a merge into `out` (a directory or s3:// prefix) and
        register the output as model `name` (default: the directory's name).

        `request`: a MergeRequest, the fields of request(), or a mergekit config (a path to a
        YAML file, its text, or its dict) of any method: a `passthrough` config (layers
        stacked, or one model copied) is a merge too, recorded with its lineage and replayable,
        reading only the layers it takes from its sources (registered models, local paths,
        s3:// and https:// URLs, Hub ids); with a config, `budget`, `seed`, `dtype` and
        `strategy` apply on top of it, and `cwd` and `report` are as for config().
        `target_deviation`: instead of a budget, as for plan()."""

        if request is not None and not isinstance(request, MergeRequest):
            _config_fields(fields)
            text, where = _config_text(request)
            copied = self._passthrough(text, where, dtype=fields.get("dtype"),
                                       seed=int(fields.get("seed") or 0), cwd=cwd,
                                       report=report)
            if copied is not None:
                if target_deviation is not None:
                    raise InvalidRequest("target_deviation: passthrough copies layers and "
                                         "reads no expert delta: there is no budget to choose",
                                         field="target_deviation")
                if fields.get("budget") is not None and report is not None:
                    report("note: budget: passthrough copies the layers it takes and reads no "
                           "expert delta; the budget does not apply")
                return self._merge(copied[0], out, name=name, overwrite=overwrite,
                                   threads=threads, progress=progress, tokenizer=copied[1])
        req, tokenizer = self._request_of(request, fields, progress=progress, cwd=cwd,
                                          report=report)
        target = _target(target_deviation, fields)
        if target is not None:
            req = self.for_deviation(req, target)[0]
        return self._merge(req, out, name=name, overwrite=overwrite, threads=threads,
                           progress=progress, tokenizer=tokenizer)

    def _merge(self, req: MergeRequest | PassthroughRequest, out: str | Path, *,
               name: str | None, overwrite: bool, threads: int | None,
               progress: bool | ProgressFn, tokenizer: TokenizerPlan | None) -> MergeSummary:
        from mergepipe.jobs.merge import merge

        if tokenizer is not None and "://" in str(out):
            raise InvalidRequest("tokenizer: the tokenizer options write files into a local "
                                 "output directory", field="output")
        finish = None
        if tokenizer is not None and isinstance(req, MergeRequest):
            from mergepipe.jobs.reindex import TokenizerStep

            finish = TokenizerStep(tokenizer, req)  # on the staged output, before publishing
        with _bars(progress, "merging", unit="block") as bar:
            summary = merge(self.db, req, out, output_name=name, progress=bar,
                            threads=threads, overwrite=overwrite, engine=self._engine(),
                            finish=finish)
        if tokenizer is not None and finish is None:  # passthrough: its files only
            from mergepipe.jobs.tokenizer import apply_tokenizer

            apply_tokenizer(tokenizer, Path(out))
        return summary

    def replay(self, merge_id: str, out: str | Path | None = None, *,
               threads: int | None = None) -> ReplayResult:
        """Re-run a stored merge's plan and compare every output tensor's hash."""
        from mergepipe.jobs.replay import replay

        return replay(self.db, merge_id, Path(out) if out is not None else None,
                      threads=threads)

    # -- evaluation -------------------------------------------------------------------------
    def compare(self, model_a: str, model_b: str, text: str, *, tokens: int = 2048,
                tokenizer: str | None = None) -> Comparison:
        """Teacher-forced KL(A || B) per token and both perplexities of two registered models
        on the first `tokens` tokens of `text` (CPU; needs the `eval` extra). `tokenizer`: the
        model whose tokenizer to use (default: A's, else B's)."""
        from mergepipe.evaluation.compare import compare

        return compare(self.db, model_a, model_b, text, tokens=tokens, tokenizer=tokenizer)

    # -- queries ----------------------------------------------------------------------------
    def sql(self, query: str) -> SqlResult:
        """One read-only SELECT over the catalog's tables, under the SQL sandbox's limits."""
        from mergepipe.sandbox.user_sql import run_user_sql

        r = run_user_sql(self.db, query, SqlLimits.from_settings(self.settings))
        return SqlResult(list(r["columns"]), [list(row) for row in r["rows"]],
                         bool(r.get("truncated", False)))

    def lineage(self, name: str) -> Lineage:
        """What `name` was merged from, and what was merged from it (NotFound if unknown)."""
        from mergepipe.catalog.lifecycle import model_lineage

        _, ancestors, descendants = model_lineage(self.db, name)
        return Lineage(ancestors, descendants)

    def _engine(self) -> Engine:
        from mergepipe.executor.engine import Engine

        return Engine.of(self.settings)


@contextmanager
def _bars(progress: bool | ProgressFn, label: str, unit: str,
          model: str | None = None) -> Iterator[ProgressFn]:
    """Progress as tqdm.auto bars (widgets in a notebook), a caller's callback, or nothing."""
    bar: Any = None

    def report(p: Progress) -> None:
        nonlocal bar
        if callable(progress):  # (an ingestion's scan does not know the model's name)
            progress(replace(p, model=p.model or model))
        if progress is not True:
            return
        if bar is None:
            from tqdm.auto import tqdm
            bar = tqdm(total=p.total, desc=label, unit=unit, leave=False,
                       unit_scale=unit == "B", unit_divisor=1024, file=sys.stderr)
        bar.total = p.total
        bar.n = p.done
        bar.refresh()

    try:
        yield report
    finally:
        if bar is not None:
            bar.close()


@contextmanager
def _named(where: str, field: str | None = None) -> Iterator[None]:
    """A MergePipeError's message prefixed with `where` (its field: `field`, else its own)."""
    try:
        yield
    except MergePipeError as e:
        raise type(e)(f"{where}: {e.message}", field=field or e.field) from None


def _experts(experts: str | Sequence[str | tuple[str, float] | dict[str, Any]]
             ) -> str | list[dict[str, Any]]:
    """The CLI's text as it is; names, (name, weight) pairs and request dicts as dicts."""
    if isinstance(experts, str):
        return experts
    return [{"model": e} if isinstance(e, str) else e if isinstance(e, dict)
            else {"model": e[0], "weight": e[1]} for e in experts]


def _target(target: float | None, fields: dict[str, Any]) -> float | None:
    """A target deviation checked (InvalidRequest naming target_deviation)."""
    from mergepipe.core.schema import check_target_deviation

    return check_target_deviation(target, budget_given=fields.get("budget") is not None)


def _budget_text(budget: float | int | str | None) -> str | None:
    """0.3 -> '0.3' (a fraction); 2_000_000 -> '2000000B' (bytes); text as it is."""
    if budget is None or isinstance(budget, str):
        return budget
    if isinstance(budget, bool):
        raise InvalidRequest("budget must be a fraction, a byte count or a size", field="budget")
    if isinstance(budget, int) and budget > 1:
        return f"{budget}B"
    return repr(float(budget))


def _config_fields(fields: dict[str, Any]) -> None:
    """With a config, only budget, seed, dtype and strategy apply on top of it."""
    extra = sorted(set(fields) - {"budget", "seed", "dtype", "strategy"})
    if extra:
        raise InvalidRequest(f"{extra[0]}: give either a config or the request's fields",
                             field=extra[0])


def _locate(cwd: str | Path | None) -> Callable[[str, str], str] | None:
    """Paths in a config relative to `cwd` (None: the working directory)."""
    from mergepipe.jobs.config import local_path

    return None if cwd is None else (lambda t, key: local_path(t, key, cwd=str(cwd)))


def _config_text(config: str | Path | dict[str, Any]) -> tuple[str, str]:
    """(YAML text, how errors name it): a path to a file, the YAML itself, or its dict."""
    if isinstance(config, dict):
        import yaml

        return yaml.safe_dump(config, sort_keys=False), "config"
    if isinstance(config, Path) or ("\n" not in config and config.endswith((".yml", ".yaml"))):
        return read_text(config, "config", field="config"), str(config)
    return config, "config"


def read_text(path: str | Path, what: str, field: str = "text") -> str:
    """A UTF-8 file's text; InvalidRequest naming the file (`what`: what it is for) if not."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise InvalidRequest(f"{path}: cannot read the {what} ({why})", field=field) from None
