"""mergekit `slices:` configs. A passthrough config (layers stacked, or one model copied) is a
catalog merge: resolved against the catalog (registered models, local paths, s3:// / https://
URLs, Hub ids pinned to their commit), planned (every source file pinned), executed by range
reads and recorded as other merges are (jobs.merge). Another method over one whole-model slice
runs as the `models:` config it equals."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mergepipe.catalog.models import ModelRow
from mergepipe.catalog.records import LineageEdge, OutcomeRecord, OutputTensorRow, PlanRecord
from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.jsonable import jsonable
from mergepipe.core.mergekit_slices import (
    LAYER_KEYS,
    PASSTHROUGH,
    PassthroughRequest,
    parse_slices,
    slices_as_models,
)
from mergepipe.core.mergekit_tokenizer import parse_tokenizer
from mergepipe.core.progress import ProgressFn
from mergepipe.executor.manifest import MANIFEST_FORMAT, file_entry, lineage_entries, tensor_entries
from mergepipe.jobs.report import MergeSummary
from mergepipe.jobs.tokenizer import TokenizerPlan, model_json, plan_tokenizer
from mergepipe.storage.checkpoint import CONFIG_FILE, Checkpoint, open_checkpoint
from mergepipe.storage.locations import is_url, parse_url
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import Stamp

if TYPE_CHECKING:
    from mergepipe.executor.slices import SliceResult

Locate = Callable[[str, str], str]  # (path or URL as written, YAML key) -> real path or URL


def is_passthrough(doc: dict[Any, Any]) -> bool:
    return str(doc.get("merge_method", "")).strip().lower() == PASSTHROUGH


def as_models(doc: dict[Any, Any], locate: Locate) -> str:
    """A non-passthrough slices: config as its models: config (YAML), once every model located
    on disk is checked to have the layers the slice takes."""
    import yaml

    rewritten, counts = slices_as_models(doc)
    for i, entry in enumerate(rewritten["models"]):
        key = f"slices[0].sources[{i}].layer_range"
        model = entry.get("model")
        if not isinstance(model, str):
            continue  # parse_config names the bad key
        try:
            path = locate(model, f"slices[0].sources[{i}].model")
        except InvalidRequest:
            continue  # a registered name: resolved (or refused) by the models: config
        have = _layers(path)
        if have is not None and have != counts[key]:
            raise InvalidRequest(
                f"{key}: {doc.get('merge_method')} over a slice of {counts[key]} layers of a "
                f"{have}-layer model is not supported (only passthrough stacks layer ranges); "
                f"take [0, {have}]", field=key)
    return yaml.safe_dump(rewritten, sort_keys=False)


# -- resolving -------------------------------------------------------------------------------
def resolve_passthrough(doc: dict[Any, Any], models: Sequence[ModelRow], locate: Locate, *,
                        dtype: str | None = None, seed: int = 0) -> PassthroughRequest:
    """The passthrough request of a config: each model a registered one (by name, or by the
    path it was ingested from), else its location (`locate`: a local path, or a URL, a Hub id
    pinned to its commit). Nothing is ingested: the merge reads only the layers it takes.
    `dtype` overrides the written dtype. Errors name the YAML key."""
    if doc.get("slices") is None:
        doc = _one_slice(doc, models, locate)
    if dtype:
        doc = {**doc, "out_dtype": dtype}
    cfg = parse_slices(doc)
    named = [(s.model, f"{s.key}.model") for p in cfg.slices for s in p.sources]
    if cfg.base is not None:
        named.insert(0, (cfg.base, "base_model"))
    found: dict[str, _Source] = {}
    for model, key in named:
        if model not in found:
            found[model] = _source(model, key, models, locate)
    for piece in cfg.slices:
        src = piece.sources[0]
        have = _layers(found[src.model].path)
        if have is not None and src.end > have:
            raise InvalidRequest(f"{src.key}.layer_range: {src.model} has {have} layers, the "
                                 f"range [{src.start}, {src.end}] ends past them",
                                 field=f"{src.key}.layer_range")
    config = _renamed(doc, {m: s.key for m, s in found.items()})
    return PassthroughRequest(config, {s.key: s.path for s in found.values()},
                              tuple(sorted({s.key for s in found.values() if s.registered})),
                              seed)


@dataclass(frozen=True)
class _Source:
    key: str  # the catalog name, else the location
    path: str
    registered: bool


def _source(text: str, key: str, models: Sequence[ModelRow], locate: Locate) -> _Source:
    named = [m for m in models if text in (m.name, m.display_name)]
    if not named:
        path = pinned(locate(text, key), key)
        named = [m for m in models if m.status == "ready" and same_path(m.path, path)]
        if not named:
            return _Source(path, path, False)
    exact = [m for m in named if m.name == text and "~" in text]  # name~N: that version
    m = exact[0] if exact else max(named, key=lambda m: m.version)  # a name: its newest
    if m.status != "ready":
        raise InvalidRequest(f"{key}: model {m.name!r} is {m.status}; wait for it or register "
                             "it again", field=key)
    if m.kind != "full":
        raise InvalidRequest(f"{key}: model {m.name!r} is a {m.kind} checkpoint; passthrough "
                             "copies the layers of full checkpoints", field=key)
    return _Source(m.name, m.path, True)


def pinned(path: str, key: str) -> str:
    """A Hub location at its commit sha (the version a merge reads and records, and what a
    registered model's path records); local paths and other URLs as they are."""
    if not is_url(path) or parse_url(path).scheme != "hf":
        return path
    from mergepipe.storage.hub import pin  # huggingface_hub: only for a Hub source

    try:
        return pin(path)
    except MergePipeError as e:
        raise type(e)(f"{key}: {e.message}", field=key) from None


def same_path(a: str, b: str) -> bool:
    """Whether two locations are one checkpoint (URLs: both canonical, as recorded and located)."""
    if is_url(a) or is_url(b):
        return a == b
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _renamed(doc: dict[Any, Any], keys: dict[str, str]) -> dict[str, Any]:
    """The config with every model written as its source key."""
    out = copy.deepcopy({str(k): v for k, v in doc.items() if k != "models"})
    if isinstance(out.get("base_model"), str):
        out["base_model"] = keys[out["base_model"].strip()]
    for piece in out["slices"]:
        for src in piece["sources"]:
            src["model"] = keys[src["model"].strip()]
    return out


def _one_slice(doc: dict[Any, Any], models: Sequence[ModelRow], locate: Locate
               ) -> dict[Any, Any]:
    """`models:` with one model: the slice of all its layers (as mergekit reads it)."""
    entries = doc.get("models")
    if not isinstance(entries, list) or len(entries) != 1 or doc.get("base_model") not in (
            None, _model_of(entries[0])):
        raise InvalidRequest("models: passthrough copies one model (mergekit refuses more, the "
                             "base_model counted); stack layers with slices:", field="models")
    entry = entries[0] if isinstance(entries[0], dict) else {"model": entries[0]}
    model = _model_of(entry)
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("models[0].model: must be a model name, a path or a Hub id",
                             field="models[0].model")
    n = _layers(_source(model, "models[0].model", models, locate).path, remote=True)
    if n is None:
        raise InvalidRequest(f"models[0].model: {model}: no num_hidden_layers in its "
                             "config.json", field="models[0].model")
    source = {"model": model, "layer_range": [0, n],
              **({"parameters": entry["parameters"]} if entry.get("parameters") else {})}
    return {**{k: v for k, v in doc.items() if k != "models"}, "slices": [{"sources": [source]}]}


def _model_of(entry: object) -> object:
    return entry.get("model") if isinstance(entry, dict) else entry


def _layers(path: str, *, remote: bool = False) -> int | None:
    """The layer count of a checkpoint's config.json; None when unknown. A remote one is read
    only when `remote` (the request threads of the service do not wait on the network)."""
    if is_url(path) and not remote:
        return None
    try:
        doc = model_json(path, CONFIG_FILE) or {}
    except (OSError, MergePipeError):
        return None
    n = next((doc[k] for k in LAYER_KEYS if k in doc), None)
    return n if isinstance(n, int) else None


def tokenizer_plan(text: str, request: PassthroughRequest) -> TokenizerPlan | None:
    """The output's tokenizer files the config's options ask for (None: the donor's, which
    the merge copies)."""
    from mergepipe.core.mergekit_config import load_document

    doc = load_document(text)
    opts = parse_tokenizer(doc)
    if opts is None:
        return None
    paths = {w: request.sources[k] for w, k in _written_names(doc, request).items()}
    donor = request.sources[request.base]
    plan = plan_tokenizer(opts, donor, paths)
    return None if plan.files_from in (None, donor) and plan.chat_template is None else plan


def _written_names(doc: dict[Any, Any], request: PassthroughRequest) -> dict[str, str]:
    """model as written in the config -> its source key."""
    out: dict[str, str] = {}
    if doc.get("slices") is None:
        return {str(_model_of(doc["models"][0])): request.base}
    for piece, mine in zip(doc["slices"], request.config["slices"], strict=True):
        for src, m in zip(piece["sources"], mine["sources"], strict=True):
            out[str(src["model"]).strip()] = m["model"]
    return out


# -- planning, executing, recording ----------------------------------------------------------
@dataclass(frozen=True)
class PassthroughPlan:
    """A passthrough request with every source file pinned (size, mtime, ETag, version id; a
    Hub file by the commit its location names)."""

    request: PassthroughRequest
    files: dict[str, dict[str, Stamp]]  # source key -> file -> stamp
    tensors: int  # written
    # the sources' headers as planning read them (none for a stored plan: read again)
    opened: dict[str, Checkpoint] = field(default_factory=dict, compare=False)

    def document(self) -> dict[str, Any]:
        return dict(jsonable({
            "operator": PASSTHROUGH, "layers": self.request.slice_config.layers,
            "tensors": self.tensors, "config": self.request.config,
            "sources": [{"model": k, "path": self.request.sources[k],
                         "registered": k in self.request.registered,
                         "files": [file_entry(p, s) for p, s in self.files[k].items()]}
                        for k in self.request.source_keys]}))

    @property
    def plan_hash(self) -> str:
        canon = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()

    def pins(self) -> dict[str, Stamp]:
        return {p: s for files in self.files.values() for p, s in files.items()}

    @staticmethod
    def from_document(request: PassthroughRequest, doc: dict[str, Any]) -> PassthroughPlan:
        return PassthroughPlan(request, {
            s["model"]: {f["path"]: Stamp(int(f["size"]), int(f["mtime_ns"]), f.get("etag"),
                                          f.get("version_id")) for f in s["files"]}
            for s in doc["sources"]}, int(doc["tensors"]))


def plan_passthrough(request: PassthroughRequest) -> PassthroughPlan:
    """Every source's files, as they are now (their headers read; no tensor data)."""
    files: dict[str, dict[str, Stamp]] = {}
    opened: dict[str, Checkpoint] = {}
    for key in request.source_keys:
        path = request.sources[key]
        try:
            opened[key] = ckpt = open_checkpoint(path)
            files[key] = {f.path: store_for(f.path).stat(f.path) for f in ckpt.files}
        except MergePipeError as e:
            raise type(e)(f"{key}: {e.message}", field=e.field) from None
        except OSError as e:
            raise InvalidRequest(f"{key}: {path} is not readable ({e.strerror})",
                                 field="sources") from None
    from mergepipe.executor.slices import output_count  # torch: only when it runs

    return PassthroughPlan(request, files, output_count(request.slice_config, opened), opened)


def execute(plan: PassthroughPlan, out_dir: Path, progress: ProgressFn | None = None
            ) -> SliceResult:
    """Copy the slices into `out_dir`, reading each pinned file at its version."""
    from mergepipe.executor.slices import write_slices  # torch: only when it runs

    req = plan.request
    return write_slices(req.slice_config, req.sources, out_dir, pins=plan.pins(),
                        opened=plan.opened, progress=progress)


def lineage(plan: PassthroughPlan, output_name: str) -> list[LineageEdge]:
    """The output -> each source (role slice; the donor of config.json first)."""
    return [LineageEdge(output_name, k, "slice", None) for k in plan.request.source_keys]


def plan_record(plan: PassthroughPlan, plan_seconds: float) -> PlanRecord:
    """The merges row's plan fields: no budget, no expert, no access set (a copy)."""
    return PlanRecord(plan_hash=plan.plan_hash, document=plan.document(), budget_bytes=0,
                      full_read_bytes=None, planned_expert_bytes=0, omission_bound=None,
                      blocks_total=plan.tensors, plan_seconds=plan_seconds, experts=[],
                      touched=[])


def outcome_record(plan: PassthroughPlan, result: SliceResult, output_name: str,
                   target: str) -> OutcomeRecord:
    """Bytes read (counted as base bytes: no expert delta), output hashes, lineage."""
    return OutcomeRecord(
        expert_bytes_read=0, base_bytes_read=result.bytes_read, output_hash=result.output_hash,
        output_path=target, exec_seconds=result.exec_seconds, bytes_by_model={},
        tensors=[OutputTensorRow(t.name, t.dtype, t.shape, t.content_hash)
                 for t in result.written],
        lineage=lineage(plan, output_name))


def manifest(plan: PassthroughPlan, result: SliceResult, *, merge_id: str | None,
             output_name: str | None, output_path: str, plan_seconds: float | None,
             wall_seconds: float | None) -> dict[str, Any]:
    """manifest.json of a passthrough merge: request, pinned sources, bytes read, outputs."""
    doc = plan.document()
    edges = lineage(plan, output_name) if output_name else []
    return dict(jsonable({
        "format": MANIFEST_FORMAT, "merge_id": merge_id, "operator": PASSTHROUGH,
        "request": plan.request.to_dict(), "plan_hash": plan.plan_hash, "plan": doc,
        "budget_bytes": 0, "expert_bytes_read": 0, "base_bytes_read": result.bytes_read,
        "inputs": [{**s, "bytes_read": result.bytes_by_source.get(s["model"], 0)}
                   for s in doc["sources"]],
        "output": {"name": output_name, "path": output_path, "hash": result.output_hash,
                   "layers": result.layers, "extra_files": result.side_files,
                   "tensors": tensor_entries(result.written)},
        "lineage": lineage_entries(edges),
        "timings": {"plan_seconds": plan_seconds, "exec_seconds": result.exec_seconds,
                    "wall_seconds": wall_seconds}}))


def summary(merge_id: str, plan: PassthroughPlan, result: SliceResult, *, output: str,
            output_name: str, plan_seconds: float, wall_seconds: float) -> MergeSummary:
    return MergeSummary(
        merge_id=merge_id, plan_hash=plan.plan_hash, operator=PASSTHROUGH, budget_bytes=0,
        full_read_bytes=None, planned_expert_bytes=0, expert_bytes_read=0,
        base_bytes_read=result.bytes_read, omission_bound=None, omission_bound_l2=None,
        predicted_deviation=None, output=output, output_name=output_name,
        output_hash=result.output_hash, blocks_total=result.tensors, expert_blocks_read=0,
        plan_seconds=plan_seconds, exec_seconds=result.exec_seconds,
        wall_seconds=wall_seconds)
