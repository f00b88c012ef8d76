"""Clean up after merges whose process died mid-run: staging dirs and unrecorded outputs."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from pathlib import Path

from mergepipe.catalog import records
from mergepipe.catalog.db import Catalog
from mergepipe.executor import publish
from mergepipe.executor.manifest import MANIFEST_FILE
from mergepipe.executor.publish import S3Output
from mergepipe.storage.locations import is_url

log = logging.getLogger("mergepipe.jobs.recovery")

INTERRUPTED = ("the process running this merge stopped before it finished (killed or crashed); "
               "nothing was published; run it again")


def recover_interrupted(cat: Catalog, error: str | None = INTERRUPTED) -> list[str]:
    """Every merge still 'running' belongs to a process that died: the caller knows that no
    other process runs merges on this catalog (the service at start-up; the CLI, which holds
    the catalog file's lock). For each: remove its staging directory, and the output it
    published but never recorded (a kill between the rename and the catalog transaction),
    putting back a directory it was replacing; then mark it failed with `error` (None: leave
    the status to the caller). Returns the merge ids."""
    ids = []
    for row in records.running_merges(cat):
        clean_merge_outputs(row)
        if error is not None:
            records.record_failure(cat, row.merge_id, error, None)
        ids.append(row.merge_id)
    return ids


def clean_merge_outputs(row: records.MergeRow) -> None:
    """What a dead run of the merge left in its output location (a folder or an S3 prefix)."""
    if row.output_path and is_url(row.output_path):
        S3Output(row.output_path).clean_interrupted(row.merge_id)
    elif row.output_path:
        clean_outputs(Path(row.output_path), row.merge_id)


def clean_outputs(target: Path, merge_id: str) -> None:
    """What a dead run of `merge_id` left around `target` on disk."""
    tag = merge_id[2:]  # + a claim's suffix on a shared catalog: every run's staging
    for stage in target.parent.glob(glob.escape(publish.staging_dir(target, tag).name) + "*"):
        log.warning("removing the staging directory %s of interrupted merge %s", stage, merge_id)
        remove(stage)
    if _published_by(target, merge_id):
        log.warning("removing %s: merge %s published it but died before recording it",
                    target, merge_id)
        remove(target)
    for old in target.parent.glob(glob.escape(f".{target.name}.old-{tag}") + "*"):
        if not os.path.lexists(target) and old.is_dir() and not old.is_symlink():
            os.rename(old, target)  # the output this merge was replacing
        else:
            remove(old)


def _published_by(target: Path, merge_id: str) -> bool:
    """True if `target` is a directory whose manifest.json names `merge_id`."""
    if target.is_symlink() or not target.is_dir():
        return False
    try:
        doc = json.loads((target / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("merge_id") == merge_id


def remove(p: Path) -> None:
    """Remove a directory (not through a link) or a file."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
