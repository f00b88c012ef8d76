"""Model versions (`name`, then `name~N`) and their retirement (docs/lifecycle.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mergepipe.catalog.db import Catalog, Connectable, load_sql, run
from mergepipe.catalog.models import ModelRow, find_model, model_row
from mergepipe.catalog.records import LineageEdge, lineage, merge_row
from mergepipe.core.errors import Conflict, NotFound

VERSION_SEP = "~"  # never in a name (ingest.NAME_PATTERN)
_PINNED = re.compile(r"(.+)~([0-9]{1,9})")


def version_key(family: str, version: int) -> str:
    """The `models.name` of one version of a name."""
    return family if version == 1 else f"{family}{VERSION_SEP}{version}"


def split_ref(ref: str) -> tuple[str, int | None]:
    """(name, version) of `name~N`; (ref, None) for a plain name."""
    m = _PINNED.fullmatch(ref)
    return (m.group(1), int(m.group(2))) if m else (ref, None)


def resolve_model(cat: Connectable, ref: str) -> ModelRow | None:
    """The model version `ref` means: `name~N` that version (retired or not), a plain name its
    latest ready version that is not retired; None if there is none."""
    family, version = split_ref(ref)
    if version is not None:
        row = run(cat, "model_version_get", {"family": family, "version": version}).first()
    else:
        row = run(cat, "model_latest", {"family": family}).first()
    return None if row is None else model_row(row)


def resolve_key(cat: Connectable, ref: str) -> str:
    """The key of the version `ref` means, or `ref` itself when none does (callers then say
    it is not found, as before versions)."""
    row = resolve_model(cat, ref)
    return row.name if row is not None else ref


def model_lineage(cat: Catalog, ref: str) -> tuple[str, list[LineageEdge], list[LineageEdge]]:
    """(the model's key, its ancestors, its descendants) for a name (its latest version) or
    `name~N`, a retired version's exact key too; NotFound when no model has that name. (The
    Python API's and the service's lineage.)"""
    key = resolve_key(cat, ref)
    ancestors, descendants = lineage(cat, key)
    if not ancestors and not descendants and find_model(cat, key) is None:
        raise NotFound(f"model {key!r} not found", field="name")
    return key, ancestors, descendants


def resolve_keys(cat: Connectable, refs: Sequence[str]) -> dict[str, str]:
    """`resolve_key` of each ref, plain names in one query for all."""
    plain = sorted({r for r in refs if split_ref(r)[1] is None})
    latest = ({str(r.family): str(r.name) for r in run(cat, "models_latest",
                                                          {"families": plain})}
              if plain else {})
    return {r: latest.get(r, r) if r in plain else resolve_key(cat, r) for r in refs}


def next_version(cat: Connectable, family: str) -> int:
    """The number a new version of `family` gets (keys of retired versions are never reused)."""
    return int(run(cat, "model_next_version", {"family": family}).scalar_one())


def live_versions(cat: Connectable, family: str) -> list[ModelRow]:
    """The versions of `family` that are not retired, oldest first."""
    return [model_row(r) for r in run(cat, "model_versions_live", {"family": family})]


@dataclass(frozen=True)
class Dependant:
    """Something that depends on a model: a merge output made from it, an expert of it, an
    unfinished ingestion onto it, or a queued or running merge reading it."""

    kind: str
    name: str
    job: str | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.name!r}" + (f" ({self.job})" if self.job else "")


def dependants(cat: Catalog, family: str, keys: list[str]) -> list[Dependant]:
    """What depends on the versions `keys` of `family`."""
    rows = cat.query("model_dependants", {"keys": keys, "refs": [*keys, family]})
    out = [Dependant(str(r.kind), str(r.name), None if r.merge_id is None else str(r.merge_id))
           for r in rows]
    for m in map(merge_row, cat.query("merges_active")):
        reads = {m.base, *(str(e.get("model")) for e in m.request.get("experts", []))}
        if reads & set(keys):
            out.append(Dependant(f"{m.status} merge", m.merge_id))
    return out


def retire_models(cat: Catalog, ref: str, *, force: bool = False) -> list[ModelRow]:
    """Retire `ref`: every live version of a plain name, or the one version `name~N`. Conflict
    (409) naming the dependants while something depends on them, unless `force`. The retired
    rows, as they were."""
    family, version = split_ref(ref)
    if version is None:
        rows = live_versions(cat, family)
    else:
        row = resolve_model(cat, ref)
        rows = [row] if row is not None and row.retired_at is None else []
    if not rows:
        raise NotFound(f"model {ref!r} is not in the catalog (or already removed)", field="name")
    keys = [r.name for r in rows]
    deps = dependants(cat, family, keys)
    if deps and not force:
        shown = ", ".join(d.describe() for d in deps[:10]) + (", ..." if len(deps) > 10 else "")
        raise Conflict(f"model {ref!r} is in use by {len(deps)} dependant(s): {shown}; remove "
                       "those first, or force the removal (the model is retired: its rows and "
                       "lineage stay)", field="name")
    with cat.transaction() as conn:
        conn.execute(load_sql("models_retire"), {"names": keys})
    return rows

