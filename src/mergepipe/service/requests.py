"""The merge request of a plan or merge body: its JSON fields, or its mergekit config resolved
against the catalog (models are registered names or paths inside the data roots)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mergepipe.catalog.queue import NewIngestJob
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.mergekit_slices import PassthroughRequest
from mergepipe.core.request import MergeRequest, request_of
from mergepipe.jobs.config import load_config, load_passthrough, not_found
from mergepipe.jobs.slices import tokenizer_plan
from mergepipe.jobs.tokenizer import TokenizerPlan
from mergepipe.service.schemas import MergeIn, PlanIn
from mergepipe.service.state import AppState
from mergepipe.storage.paths import confine_source
from mergepipe.storage.remote import remote_scope

TOKENIZER_REFUSED = ("the tokenizer options (chat_template, another model's tokenizer) are "
                     "written by a merge (POST /v1/merges, `mergepipe merge CONFIG.yml`); a "
                     "plan keeps the base's tokenizer files")
PASSTHROUGH_TOKENIZER = ("the tokenizer options of a passthrough config are written by "
                         "`mergepipe merge CONFIG.yml`; the service keeps the donor's "
                         "tokenizer files")


@dataclass(frozen=True)
class BodyRequest:
    """A validated request, and the ingestions its config needs first (paths not registered)."""

    request: MergeRequest
    to_ingest: list[NewIngestJob] = field(default_factory=list)
    tokenizer: TokenizerPlan | None = None  # a merge body's config's tokenizer options


@dataclass(frozen=True)
class PassthroughBody:
    """A passthrough config's request (its sources are read where they are: no ingestion)."""

    request: PassthroughRequest
    to_ingest: list[NewIngestJob] = field(default_factory=list)
    tokenizer: None = None  # the donor's tokenizer files


def body_request(st: AppState, body: PlanIn) -> BodyRequest:
    """The budgeted request of a body (422 naming the field). `budget`, `seed` and
    `output.dtype` of the body apply on top of a config; relative config paths are relative to
    the first data root. A passthrough config is refused (it has no plan): merge_request."""
    if body.config_yaml is None:
        return BodyRequest(request_of(body.checked()))  # the body's schema checked it
    req = _config_request(st, body)
    if req.tokenizer is not None:
        raise InvalidRequest(f"config_yaml.tokenizer: {TOKENIZER_REFUSED}",
                             field="config_yaml.tokenizer")
    return req


def merge_request(st: AppState, body: MergeIn) -> BodyRequest | PassthroughBody:
    """The request of a merge body: body_request's, or a passthrough config's (its sources
    confined to the data and remote roots; the budget and strategy do not apply to a copy)."""
    if body.config_yaml is None:
        return body_request(st, body)
    try:
        copied = load_passthrough(st.cat, body.config_yaml, locate=_locator(st),
                                  dtype=body.output_dtype(), seed=body.seed)
        if copied is not None and tokenizer_plan(body.config_yaml, copied) is not None:
            raise InvalidRequest(PASSTHROUGH_TOKENIZER, field="tokenizer")
    except MergePipeError as e:
        raise _in_config(e) from None
    if copied is None:
        return _config_request(st, body)
    if body.target_deviation is not None:
        raise InvalidRequest("target_deviation: passthrough copies layers and reads no expert "
                             "delta: there is no budget to choose", field="target_deviation")
    return PassthroughBody(copied)


def _in_config(e: MergePipeError) -> MergePipeError:
    """An error of the body's config, named by its key under config_yaml."""
    key = f"config_yaml.{e.field}" if e.field else "config_yaml"
    return type(e)(f"config_yaml: {e.message}", field=key)


def _locator(st: AppState) -> Callable[[str, str], str]:
    """Config paths confined to the data roots, URLs to the remote roots."""
    def locate(text: str, key: str) -> str:
        try:
            return confine_source(text, st.settings.data_roots, st.settings.remote_roots,
                                  field=key)
        except MergePipeError as e:
            if "does not exist" in e.message:
                raise not_found(text, key) from None
            raise
    return locate


def _config_request(st: AppState, body: PlanIn) -> BodyRequest:
    assert body.config_yaml is not None
    budget = body.budget.value() if body.budget is not None else None
    try:
        # the tokenizer options read the models' small files now: confined as a job's reads
        with remote_scope(st.settings.remote_roots, st.settings.job_timeout_s):
            request, resolved = load_config(st.cat, body.config_yaml, budget=budget,
                                            seed=body.seed, locate=_locator(st))
    except MergePipeError as e:
        if e.field in ("budget", "seed"):
            raise
        raise _in_config(e) from None
    if body.output_dtype():
        request = replace(request, output_dtype=body.output_dtype())
    if body.strategy is not None:
        request = replace(request, strategy=body.strategy)
    jobs = [replace(j, field=f"config_yaml.{j.field}") for j in resolved.to_ingest]
    return BodyRequest(request, jobs, resolved.tokenizer)
