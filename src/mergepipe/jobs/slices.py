"""mergekit `slices:` configs: passthrough layer stacking run from local checkpoints, and another
method over one whole-model slice turned into the `models:` config it equals."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_slices import (
    LAYER_KEYS,
    PASSTHROUGH,
    SliceConfig,
    parse_slices,
    slices_as_models,
)
from mergepipe.core.mergekit_tokenizer import parse_tokenizer

if TYPE_CHECKING:
    from mergepipe.executor.slices import SliceResult
from mergepipe.jobs.tokenizer import apply_tokenizer, plan_tokenizer, read_json
from mergepipe.storage.locations import is_url

# (path or URL as written, YAML key) -> real path or URL: jobs.config.Locate
Locate = Any


def is_passthrough(doc: dict[Any, Any]) -> bool:
    return str(doc.get("merge_method", "")).strip().lower() == PASSTHROUGH


def as_models(doc: dict[Any, Any], locate: Locate) -> str:
    """A non-passthrough slices: config as its models: config (YAML), once every model located
    on disk is checked to have the layers the slice takes."""
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


def run_passthrough(doc: dict[Any, Any], out: Path, locate: Locate, *,
                    overwrite: bool = False) -> tuple[SliceConfig, SliceResult]:
    """Copy the slices of a passthrough config into `out` (local checkpoints). `models:` with one
    model is the slice of all its layers (as mergekit reads it)."""
    cfg = parse_slices(_one_slice(doc, locate) if doc.get("slices") is None else doc)
    paths: dict[str, str] = {}
    named = [(s.model, f"{s.key}.model") for p in cfg.slices for s in p.sources]
    if cfg.base is not None:
        named.insert(0, (cfg.base, "base_model"))
    for model, key in named:
        if model not in paths:
            path = locate(model, key)
            if is_url(path):
                raise InvalidRequest(f"{key}: {model!r}: passthrough slices copy from local "
                                     "checkpoints; download it first", field=key)
            paths[model] = path
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise InvalidRequest(f"{out}: the output directory is not empty (--overwrite "
                                 "replaces its files)", field="output")
        for old in out.iterdir():  # no stale shard or side file beside the new ones
            if old.is_symlink() or old.is_file():
                old.unlink()
    opts = parse_tokenizer(doc)
    tokenizer = None if opts is None else plan_tokenizer(opts, paths[cfg.donor], paths)
    from mergepipe.executor.slices import write_slices  # torch: only when it runs

    result = write_slices(cfg, paths, out)
    if tokenizer is not None:
        apply_tokenizer(tokenizer, out)
    return cfg, result


def _one_slice(doc: dict[Any, Any], locate: Locate) -> dict[Any, Any]:
    models = doc.get("models")
    if not isinstance(models, list) or len(models) != 1 or doc.get("base_model") not in (
            None, _model_of(models[0])):
        raise InvalidRequest("models: passthrough copies one model (mergekit refuses more, the "
                             "base_model counted); stack layers with slices:", field="models")
    entry = models[0] if isinstance(models[0], dict) else {"model": models[0]}
    model = _model_of(entry)
    if not isinstance(model, str):
        raise InvalidRequest("models[0].model: must be a local path", field="models[0].model")
    n = _layers(locate(model, "models[0].model"))
    if n is None:
        raise InvalidRequest(f"models[0].model: {model}: no num_hidden_layers in its "
                             "config.json", field="models[0].model")
    source = {"model": model, "layer_range": [0, n],
              **({"parameters": entry["parameters"]} if entry.get("parameters") else {})}
    return {**{k: v for k, v in doc.items() if k != "models"}, "slices": [{"sources": [source]}]}


def _model_of(entry: object) -> object:
    return entry.get("model") if isinstance(entry, dict) else entry


def _layers(path: str) -> int | None:
    if is_url(path):
        return None
    doc = read_json(Path(path) / "config.json") or {}
    n = next((doc[k] for k in LAYER_KEYS if k in doc), None)
    return n if isinstance(n, int) else None
