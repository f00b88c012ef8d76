"""A mergekit config resolved against the catalog: models matched by name or path, or to ingest.

Resolving never ingests, and never waits on the network (the service resolves configs in its
request threads): models the config names by an unregistered path come back as ingestion jobs
to run (the CLI runs them in turn; the service queues them with the merge); whether an expert
named by URL is a LoRA adapter is left to its ingestion job (kind `auto`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from mergepipe.catalog import queue
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import ModelRow, list_models
from mergepipe.catalog.queue import NewIngestJob
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.mergekit_config import (
    BudgetSpec,
    MergekitConfig,
    ModelRef,
    load_document,
    parse_config,
)
from mergepipe.core.mergekit_slices import PassthroughRequest
from mergepipe.core.mergekit_tokenizer import TokenizerOptions
from mergepipe.core.request import MergeRequest, build_request
from mergepipe.core.vocab import AUTO
from mergepipe.jobs import slices
from mergepipe.jobs.slices import Locate, same_path
from mergepipe.jobs.tokenizer import TokenizerPlan, plan_tokenizer
from mergepipe.storage.checkpoint import ADAPTER_CONFIG
from mergepipe.storage.locations import basename, hub_id_location, is_url, join, parse_url
from mergepipe.storage.store import store_for

_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class ResolvedConfig:
    """A config whose models are catalog names; `to_ingest` are those to register first."""

    config: MergekitConfig
    base: str
    experts: list[str]
    to_ingest: list[NewIngestJob] = field(default_factory=list)
    # the output's tokenizer, when the config's options change the base's files (jobs.tokenizer)
    tokenizer: TokenizerPlan | None = None

    def request(self, *, budget: BudgetSpec = None, seed: int | None = 0) -> MergeRequest:
        """The validated merge request; errors name the YAML key."""
        args = self.config.request_args(self.base, self.experts)
        try:
            return build_request(**args, budget=budget, seed=seed)
        except InvalidRequest as e:
            key = self.config.yaml_key(e.field)
            if key == e.field:
                raise
            raise InvalidRequest(f"{key}: {e.message.removeprefix(f'{e.field}: ')}",
                                 field=key) from None


def resolve(cat: Catalog, cfg: MergekitConfig, *, locate: Locate | None = None,
            reserved: Iterable[str] = ()) -> ResolvedConfig:
    """Match every model to a registered one (by name or path), to one queued for ingestion
    from the same path, or make it an ingestion job of its own (named apart from `reserved`),
    the base first. `locate(text, key)`: a path from the config as a real path or a canonical
    URL (default: local_path; the service confines them to its data and remote roots)."""
    locate = locate or local_path
    # by name: the queued ingestions, and this config's own
    pending = {j.model: NewIngestJob(j.model, j.kind, j.path, j.base, j.block_bytes,
                                     j.with_stats) for j in queue.unfinished_ingest_models(cat)
               if j.status != "failed"}
    models = list_models(cat)
    # a queued merge's output name is claimed too: an ingestion named after it would be refused
    taken = {m.display_name for m in models} | set(pending) | set(reserved) | queue.pending_outputs(cat)
    to_ingest: list[NewIngestJob] = []

    def find(ref: ModelRef, base: str | None, kind: str) -> str:
        found = _match(ref, models, base=base)
        if found is not None:
            return found
        path = locate(ref.text, ref.key)
        found = _match(ref, models, base=base, path=path) or _pending(pending, path, base)
        if found is not None:
            return found
        if is_url(path):
            kind = AUTO if kind == "full" and base is not None else kind  # found by the job
        elif has_adapter_config(path):
            kind = "lora"
        job = NewIngestJob(_free_name(path, taken), kind, path, base, field=ref.key)
        taken.add(job.model)
        pending[job.model] = job
        to_ingest.append(job)
        return job.model

    inferred = _infer_base(cfg, models, locate) if cfg.base is None else None
    if cfg.base is None and inferred is None:
        cfg = cfg.as_soup()  # a model soup: one of the models becomes the base
    base_name = find(cfg.base, None, "full") if cfg.base is not None else str(inferred)
    names = _experts(cfg, base_name, find)
    resolved = ResolvedConfig(cfg, base_name, names, to_ingest)
    if cfg.tokenizer is not None:
        resolved.tokenizer = _tokenizer(cfg, resolved, models, locate)
    return resolved


def _experts(cfg: MergekitConfig, base_name: str,
             find: Callable[[ModelRef, str | None, str], str]) -> list[str]:
    """The catalog names of the config's experts, found or queued for ingestion by `find`."""
    names: list[str] = []
    for e in cfg.experts:
        if e.ref.lora is None:
            found = find(e.ref, base_name, "full")
        elif cfg.base is not None and e.ref.same_model(cfg.base):
            found = find(ModelRef(e.ref.key, e.ref.lora), base_name, "lora")
        else:
            raise InvalidRequest(
                f"{e.ref.key}: {e.ref.text}+{e.ref.lora} applies the adapter to {e.ref.text}, "
                "which is not base_model; an adapter merges onto the base it was trained on",
                field=e.ref.key)
        if found in names:
            raise InvalidRequest(f"{e.ref.key}: {found!r} is listed twice", field=e.ref.key)
        names.append(found)
    return names


def _tokenizer(cfg: MergekitConfig, resolved: ResolvedConfig, models: list[ModelRow],
               locate: Locate) -> TokenizerPlan | None:
    """The tokenizer plan of the config's options, from its models' directories (None: the
    base's files, as every merge copies them)."""
    assert cfg.tokenizer is not None
    where = {m.name: m.path for m in models} | {j.model: j.path for j in resolved.to_ingest}
    # a Hub model queued unpinned (the service's URLs) is read at one commit, planned and run
    where = {n: slices.pinned(p, cfg.tokenizer.key) for n, p in where.items()}
    paths = {e.ref.text: where[n] for e, n in zip(cfg.experts, resolved.experts, strict=True)
             if e.ref.lora is None and n in where}
    base = where.get(resolved.base)
    if base is None:
        raise InvalidRequest(f"{cfg.tokenizer.key}: the base's checkpoint is not known",
                             field=cfg.tokenizer.key)
    paths = {cfg.base.text if cfg.base is not None else "base_model": base, **paths}
    order = [e.ref.text for e in cfg.experts]
    base_text = next(iter(paths))
    if cfg.base_weight is not None and cfg.base_position is not None:
        order.insert(cfg.base_position, base_text)  # mergekit sums the base where it is listed
    else:
        order.append(base_text)
    opts = _token_models(cfg.tokenizer, paths, locate)
    source = opts.source
    if source not in (None, "base", "union") and source not in paths:
        paths[str(source)] = locate(str(source), opts.key)
    plan = plan_tokenizer(opts, base, paths, [t for t in order if t in paths], reindex=True)
    if plan.reindex is not None and any(e.ref.lora is not None for e in cfg.experts):
        raise InvalidRequest(f"{opts.key}: re-indexing the embeddings of a LoRA expert is not "
                             "supported", field=opts.key)
    return None if (plan.files_from in (None, base) and plan.chat_template is None
                    and plan.reindex is None and not plan.added) else plan


def _token_models(opts: TokenizerOptions, paths: dict[str, str], locate: Locate
                  ) -> TokenizerOptions:
    """tokenizer.tokens sources naming a model by another spelling of its path: as the
    config's own text of that model (unknown ones stay, refused by plan_tokenizer)."""
    specs = []
    for spec in opts.tokens:
        model = spec.source.model
        if model is not None and model not in paths:
            key = f"tokenizer.tokens.{spec.name}.source"
            try:
                where = locate(model, key)
            except MergePipeError:
                where = None
            same = next((t for t, p in paths.items() if where and same_path(p, where)), None)
            if same is not None:
                spec = replace(spec, source=replace(spec.source, model=same))
        specs.append(spec)
    return replace(opts, tokens=tuple(specs))


def load_config(cat: Catalog, text: str | bytes, *, budget: BudgetSpec = None,
                seed: int | None = 0, locate: Locate | None = None,
                reserved: Iterable[str] = ()) -> tuple[MergeRequest, ResolvedConfig]:
    """Parse and resolve a mergekit config and build its merge request (models to ingest
    first in the ResolvedConfig). A slices: config runs as the models: config it equals; a
    passthrough config has no budgeted plan (load_passthrough)."""
    doc = load_document(text)
    if slices.is_passthrough(doc):
        raise InvalidRequest("merge_method: passthrough copies layers and reads no expert "
                             "delta, so there is no budgeted plan to make; merge it (mergepipe "
                             "merge CONFIG.yml, POST /v1/merges, Catalog.merge)",
                             field="merge_method")
    if doc.get("slices") not in (None, [], {}):
        text = slices.as_models(doc, locate or local_path)
    resolved = resolve(cat, parse_config(text), locate=locate, reserved=reserved)
    return resolved.request(budget=budget, seed=seed), resolved


def load_passthrough(cat: Catalog, text: str | bytes, *, locate: Locate | None = None,
                     dtype: str | None = None, seed: int | None = 0
                     ) -> PassthroughRequest | None:
    """The passthrough request of a mergekit config (jobs.slices.resolve_passthrough); None for
    a config of another method (load_config)."""
    doc = load_document(text)
    if not slices.is_passthrough(doc):
        return None
    return slices.resolve_passthrough(doc, list_models(cat), locate or local_path, dtype=dtype,
                                      seed=seed or 0)


def _infer_base(cfg: MergekitConfig, models: list[ModelRow], locate: Locate) -> str | None:
    """No base_model (mergekit linear): the base all registered models are experts of (the
    unregistered ones, local paths, are registered as its experts too); None when no model is
    registered against a base (a model soup: MergekitConfig.as_soup). A model that is neither
    registered nor a path is refused here, naming its key."""
    bases: set[str | None] = set()
    for e in cfg.experts:
        if e.ref.lora is not None:
            bases.add(None)
            continue
        found = _match(e.ref, models, base=None, any_base=True)
        if found is None:
            found = _match(e.ref, models, base=None, path=locate(e.ref.text, e.ref.key),
                           any_base=True)
        row = next((m for m in models if m.name == found), None)
        if row is not None:
            bases.add(row.base)
    if len(bases) == 1 and None not in bases:
        return str(bases.pop())
    if cfg.operator == "linear":
        return None
    raise InvalidRequest(
        "base_model: missing. MergePipe stores experts as deltas against the base they were "
        "fine-tuned from; add base_model: PATH", field="base_model")


def has_adapter_config(path: str) -> bool:
    """Whether the checkpoint at `path` is a PEFT adapter directory (it has adapter_config.json)."""
    target = join(path, ADAPTER_CONFIG)
    try:
        return store_for(target).kind(target) is not None
    except OSError:
        return False


def _match(ref: ModelRef, models: list[ModelRow], *, base: str | None,
           path: str | None = None, any_base: bool = False) -> str | None:
    """The registered model named `ref` (or, given `path`, ingested from it) with base `base`."""
    if path is None:
        cands = [m for m in models if ref.text in (m.name, m.display_name)]  # name~N, name
    else:
        cands = [m for m in models if same_path(m.path, path)]
    right = [m for m in cands if any_base or m.base == base]
    if not right:
        if cands and path is None:
            m = cands[0]
            role = "a base model" if m.base is None else f"an expert of {m.base!r}"
            want = "a base model" if base is None else f"an expert of {base!r}"
            raise InvalidRequest(f"{ref.key}: model {ref.text!r} is registered as {role}, but "
                                 f"the config uses it as {want}", field=ref.key)
        return None
    ready = [m for m in right if m.status == "ready"]
    if not ready:
        m = right[0]
        raise InvalidRequest(f"{ref.key}: model {m.name!r} is {m.status}"
                             + (f" ({m.error})" if m.error else "")
                             + "; wait for it or register it again", field=ref.key)
    return sorted(ready, key=lambda m: m.name)[0].name


def _pending(pending: dict[str, NewIngestJob], path: str, base: str | None) -> str | None:
    """A model already queued for ingestion from `path` with base `base`."""
    for name, job in sorted(pending.items()):
        if job.base == base and same_path(job.path, path):
            return name
    return None


def local_path(text: str, key: str, cwd: str | None = None) -> str:
    """A checkpoint from the config: a URL (canonical), a local path (relative to `cwd`,
    default the working directory) that exists, or else a Hub id (org/name[@revision]) as
    hf:// (as mergekit reads them: a local directory of that name wins)."""
    if is_url(text):
        return slices.pinned(str(parse_url(text, key)), key)
    path = Path(cwd or ".") / Path(text).expanduser()
    if path.exists():
        return str(path.resolve())
    hub = hub_id_location(text)
    if hub is None:
        raise not_found(text, key)
    return slices.pinned(str(parse_url(hub, key)), key)


def not_found(text: str, key: str) -> InvalidRequest:
    """The error for a model that is neither registered, on disk nor a Hub id."""
    return InvalidRequest(f"{key}: {text!r} is neither a registered model, a local path nor a "
                          "Hub id (org/name[@revision])", field=key)


def _free_name(path: str, taken: set[str]) -> str:
    """A model name from the checkpoint's file or folder name (a Hub repo's name, without its
    revision), not taken yet."""
    last = basename(path)
    if is_url(path) and parse_url(path).scheme == "hf" and "/" not in parse_url(path).key:
        last = last.partition("@")[0]
    stem = _NAME_CHARS.sub("-", last.removesuffix(".safetensors")).strip("-._")[:100]
    stem = stem or "model"
    name, n = stem, 2
    while name in taken:
        name, n = f"{stem}-{n}", n + 1
    return name
