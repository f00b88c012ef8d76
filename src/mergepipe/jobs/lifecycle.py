"""Removing models and merges (docs/lifecycle.md): retire a model (refused while something
depends on it, unless forced), optionally deleting a merge output's directory under the output
root; cancel a queued or running merge, retire a finished one."""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.lifecycle import retire_models
from mergepipe.catalog.models import list_models
from mergepipe.core.errors import InvalidRequest

log = logging.getLogger("mergepipe.jobs.lifecycle")


@dataclass(frozen=True)
class Removal:
    """What removing a model did: the versions retired, the directories deleted, and the
    directories kept (with why)."""

    name: str
    retired: list[str]
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def remove_model(cat: Catalog, ref: str, *, force: bool = False, delete_files: bool = False,
                 output_root: Path | None = None) -> Removal:
    """Retire model `ref` (every live version of a name, or the version `name~N`); Conflict
    naming its dependants unless `force`. With `delete_files`, the directory of each retired
    merge output that lies inside `output_root` is deleted; no other file ever is."""
    if delete_files and output_root is None:
        raise InvalidRequest("deleting files needs an output root (--output-root); only merge "
                             "outputs under it are ever deleted", field="delete_files")
    rows = retire_models(cat, ref, force=force)
    deleted: list[str] = []
    kept: list[str] = []
    if delete_files:
        assert output_root is not None
        root = output_root.resolve()
        live = {m.path for m in list_models(cat)}
        for m in rows:
            path = Path(m.path)
            if m.source_merge is None:
                kept.append(f"{m.path} (not a merge output)")
            elif not path.resolve().is_relative_to(root) or path.resolve() == root \
                    or path.is_symlink():
                kept.append(f"{m.path} (not under the output root {root})")
            elif m.path in live:
                kept.append(f"{m.path} (another model uses it)")
            elif path.is_dir():
                shutil.rmtree(path)
                log.info("deleted the output %s of retired model %r", path, m.name)
                deleted.append(m.path)
    return Removal(ref, [m.name for m in rows], deleted, kept)


def remove_merge(cat: Catalog, merge_id: str) -> records.MergeRow:
    """Cancel a queued or running merge (a running one stops at its next progress report,
    between blocks, and publishes nothing), or retire a finished one. The merge's row after."""
    row = records.get_merge(cat, merge_id)
    if row.status in ("queued", "running"):
        records.cancel_merge(cat, merge_id)
    elif row.retired_at is None:
        records.retire_merge(cat, merge_id)
    return records.get_merge(cat, merge_id)
