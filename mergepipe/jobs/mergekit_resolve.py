"""Resolve a parsed mergekit config against the catalog: match models by name or path, or ingest them."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mergepipe.core.errors import InvalidRequest, MergePipeError
from mergepipe.core.mergekit_config import (
    BudgetSpec,
    MergekitConfig,
    ModelRef,
    ResolvedConfig,
    parse_config,
)
from mergepipe.core.request import MergeRequest

_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")

Progress = Callable[[str, int, int], None]  # (model name, done bytes, total bytes)
Locate = Callable[[str, str], Path]  # (path as written, YAML key) -> real path


def resolve(cat: Any, cfg: MergekitConfig, *, ingest: bool = True, locate: Locate | None = None,
            reserved: Iterable[str] = (), progress: Progress | None = None) -> ResolvedConfig:
    """Match every model to a registered one (by name or path) or ingest it, the base first.

    `locate(text, key)` turns a path from the config into a real path (default: local paths,
    relative to the working directory, as mergekit); the service confines them to its data
    roots. `reserved` names are not used for models ingested here.
    """
    locate = locate or local_path
    from mergepipe.catalog.models import list_models
    models = list_models(cat)
    ingested: list[str] = []

    def find_or_ingest(ref: ModelRef, base: str | None, kind: str) -> str:
        nonlocal models
        found = _match(ref, models, base=base)
        if found is not None:
            return found
        path = locate(ref.text, ref.key)
        found = _match(ref, models, base=base, path=path)
        if found is not None:
            return found
        if (path / "adapter_config.json").exists():
            kind = "lora"
        taken = {str(m["name"]) for m in models} | set(reserved)
        found = _ingest(cat, path, ref, base, kind, taken, ingest, progress)
        ingested.append(found)
        models = list_models(cat)
        return found

    if cfg.base is None:
        base_name = _infer_base(cfg, models, locate)
    else:
        base_name = find_or_ingest(cfg.base, None, "full")
    names: list[str] = []
    for e in cfg.experts:
        if e.ref.lora is None:
            found = find_or_ingest(e.ref, base_name, "full")
        elif cfg.base is not None and e.ref.same_model(cfg.base):
            found = find_or_ingest(ModelRef(e.ref.key, e.ref.lora), base_name, "lora")
        else:
            raise InvalidRequest(
                f"{e.ref.key}: {e.ref.text}+{e.ref.lora} applies the adapter to {e.ref.text}, "
                "which is not base_model; an adapter merges onto the base it was trained on",
                field=e.ref.key)
        if found in names:
            raise InvalidRequest(f"{e.ref.key}: {found!r} is listed twice", field=e.ref.key)
        names.append(found)
    return ResolvedConfig(cfg, base_name, names, ingested)


def _infer_base(cfg: MergekitConfig, models: list[dict[str, Any]], locate: Locate) -> str:
    """No base_model (mergekit linear): use the base all experts are registered against."""
    bases: set[str | None] = set()
    for e in cfg.experts:
        found = None
        if e.ref.lora is None:
            try:
                found = _match(e.ref, models, base=None, any_base=True) or _match(
                    e.ref, models, base=None, path=locate(e.ref.text, e.ref.key), any_base=True)
            except MergePipeError:
                found = None
        row = next((m for m in models if m["name"] == found), None)
        bases.add(row.get("base") if row else None)
    if len(bases) == 1 and None not in bases:
        return str(bases.pop())
    raise InvalidRequest(
        "base_model: missing. MergePipe stores experts as deltas against the base they were "
        "fine-tuned from; add base_model: PATH" + (
            " and list it under models: with weight: 0 so that, as in mergekit, it stays out of "
            "the average" if cfg.operator == "linear" else ""), field="base_model")


def _same_path(a: object, b: Path) -> bool:
    try:
        return os.path.samefile(str(a), b)
    except OSError:
        return False


def _match(ref: ModelRef, models: list[dict[str, Any]], *, base: str | None,
           path: Path | None = None, any_base: bool = False) -> str | None:
    """The registered model named `ref` (or, given `path`, ingested from it) with base `base`."""
    if path is None:
        cands = [m for m in models if m.get("name") == ref.text]
    else:
        cands = [m for m in models if _same_path(m.get("path"), path)]
    right = [m for m in cands if any_base or m.get("base") == base]
    if not right:
        if cands and path is None:
            m = cands[0]
            role = "a base model" if m.get("base") is None else f"an expert of {m['base']!r}"
            want = "a base model" if base is None else f"an expert of {base!r}"
            raise InvalidRequest(f"{ref.key}: model {ref.text!r} is registered as {role}, but "
                                 f"the config uses it as {want}", field=ref.key)
        return None
    ready = [m for m in right if m.get("status", "ready") == "ready"]
    if not ready:
        m = right[0]
        raise InvalidRequest(f"{ref.key}: model {m['name']!r} is {m.get('status')}"
                             + (f" ({m['error']})" if m.get("error") else "")
                             + "; wait for it or register it again", field=ref.key)
    return str(sorted(ready, key=lambda m: str(m["name"]))[0]["name"])


def local_path(text: str, key: str) -> Path:
    """A local checkpoint path from the config (relative to the working directory)."""
    path = Path(text).expanduser()
    if not path.exists():
        raise not_found(text, key)
    return path.resolve()


def not_found(text: str, key: str) -> InvalidRequest:
    """The error for a model that is neither registered nor on disk (with the fix)."""
    hub = re.fullmatch(r"[\w.-]+/[\w.-]+", text) is not None
    hint = (f"; MergePipe never downloads - fetch it first (hf download {text} --local-dir DIR) "
            "and give the directory" if hub else "")
    return InvalidRequest(f"{key}: {text!r} is neither a registered model nor a local path{hint}",
                          field=key)


def _ingest(cat: Any, path: Path, ref: ModelRef, base: str | None, kind: str, taken: set[str],
            ingest: bool, progress: Progress | None) -> str:
    name = _free_name(path, taken)
    if not ingest:
        raise InvalidRequest(f"{ref.key}: {path} is not registered; register it first "
                             f"(mergepipe ingest {path} --name {name}"
                             + (f" --base {base}" if base else "") + ")", field=ref.key)
    from mergepipe.catalog.ingest import ingest_model
    cb = (lambda done, total: progress(name, done, total)) if progress else None
    try:
        row = ingest_model(cat, path, name, base=base, kind=kind, with_stats=True, progress=cb)
    except MergePipeError as e:
        raise type(e)(f"{ref.key}: {e.message}", field=ref.key) from None
    return str(row["name"])


def _free_name(path: Path, taken: set[str]) -> str:
    stem = _NAME_CHARS.sub("-", path.name.removesuffix(".safetensors")).strip("-._")[:100]
    stem = stem or "model"
    name, n = stem, 2
    while name in taken:
        name, n = f"{stem}-{n}", n + 1
    return name


def load_config(cat: Any, text: str | bytes, *, budget: BudgetSpec = None, seed: int | None = 0,
                ingest: bool = True, locate: Locate | None = None, reserved: Iterable[str] = (),
                progress: Progress | None = None) -> tuple[MergeRequest, ResolvedConfig]:
    """Parse, resolve (ingesting local paths) and build the merge request of a mergekit config."""
    resolved = resolve(cat, parse_config(text), ingest=ingest, locate=locate, reserved=reserved,
                       progress=progress)
    return resolved.request(budget=budget, seed=seed), resolved
