"""Publish a merge output: a local directory atomically (staged beside it, one rename), or s3://."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from mergepipe.core.errors import Conflict, InvalidRequest
from mergepipe.executor.manifest import MANIFEST_FILE
from mergepipe.storage.locations import is_url, join, parse_url
from mergepipe.storage.remote import RemoteScope, current_scope, using
from mergepipe.storage.store import s3_store
from mergepipe.storage.store_types import FILE

PART_BYTES = 8 << 20  # S3 parts are at least 5 MiB (but the last)
UPLOAD_THREADS = 4
log = logging.getLogger("mergepipe.executor.publish")


def check_target(target: Path, *, overwrite: bool = False) -> None:
    """Raise Conflict if `target` exists and is not an empty directory (unless `overwrite`)."""
    if not os.path.lexists(target):
        return
    if not target.is_dir() or target.is_symlink():
        raise Conflict(f"output {target} exists and is not a directory", field="output")
    if not overwrite and any(target.iterdir()):
        raise Conflict(f"output directory {target} exists and is not empty; choose another "
                       "output, or pass --overwrite to replace it (and retire the model it "
                       "held)", field="output")


def staging_dir(target: Path, tag: str) -> Path:
    return target.parent / f".{target.name}.tmp-{tag}"


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def staged(target: Path, tag: str, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging directory; publish it on normal exit, discard it on any exception."""
    out = LocalOutput(target)
    stage = out.stage(tag, overwrite=overwrite)
    try:
        yield stage
        out.publish(stage, overwrite=overwrite)
    except BaseException:
        discard(stage)
        raise


def _fresh_dir(path: Path) -> Path:
    """An empty directory at `path` (what a dead run left there removed)."""
    if os.path.lexists(path):
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalOutput:
    """A local output directory: staged beside it, published by one rename."""

    def __init__(self, location: str | Path) -> None:
        self.path = Path(location).absolute()
        self.location = str(self.path)

    def check(self, *, overwrite: bool = False) -> None:
        check_target(self.path, overwrite=overwrite)

    def stage(self, tag: str, *, overwrite: bool = False) -> Path:
        """Check the target and create an empty staging directory beside it."""
        if not self.path.name:
            raise InvalidRequest(f"output {self.path} has no directory name", field="output")
        check_target(self.path, overwrite=overwrite)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return _fresh_dir(staging_dir(self.path, tag))

    def publish(self, stage: Path, *, overwrite: bool = False) -> None:
        """fsync everything in `stage` and rename it to the target (one step: all or nothing)."""
        target = self.path
        for f in stage.iterdir():
            if f.is_file():
                _fsync_path(f)
        _fsync_path(stage)
        check_target(target, overwrite=overwrite)
        old = None
        if target.is_dir():
            if any(target.iterdir()):
                old = target.parent / f".{target.name}.old-{stage.name.rsplit('-', 1)[-1]}"
                os.rename(target, old)
            else:
                target.rmdir()
        try:
            os.rename(stage, target)
        except OSError as e:
            if old is not None:
                os.rename(old, target)
            raise Conflict(f"cannot publish {target}: {e.strerror}", field="output") from None
        _fsync_path(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        discard(self.path)


def output_for(location: str | Path) -> LocalOutput | S3Output:
    text = str(location)
    return S3Output(text) if is_url(text) else LocalOutput(location)


class S3Output:
    """An output directory s3://bucket/prefix/NAME."""

    def __init__(self, location: str) -> None:
        url = parse_url(location, "output")
        if url.scheme != "s3" or not url.key:
            raise InvalidRequest(f"output {location!r}: remote outputs go to "
                                 "s3://bucket/prefix", field="output")
        self.location = str(url)
        self.store = s3_store(self.location)

    def check(self, *, overwrite: bool = False) -> None:
        if overwrite:
            raise InvalidRequest("overwriting an s3:// output is not supported; choose a new "
                                 "prefix", field="output")
        if self.store.any_under(self.location):
            raise Conflict(f"output {self.location} already holds objects; choose another "
                           "output", field="output")

    def stage(self, tag: str, *, overwrite: bool = False) -> Path:
        """The local scratch directory the output is built in (needs the output's size)."""
        return _fresh_dir(stage_dir(tag))

    def publish(self, stage: Path, *, overwrite: bool = False) -> None:
        self.check(overwrite=overwrite)
        files = sorted((f for f in stage.iterdir() if f.is_file()),
                       key=lambda f: (f.name == MANIFEST_FILE, f.name))
        uploads: list[tuple[str, str]] = []
        completed: list[str] = []
        scope = current_scope()  # the job's deadline holds in the upload threads too
        try:
            with ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="mergepipe-up") as pool:
                parts = []
                for f in files:
                    key = join(self.location, f.name)
                    uploads.append((key, self.store.start_upload(key)))
                    n = max(1, -(-f.stat().st_size // PART_BYTES))
                    parts.append([pool.submit(self._part, scope, f, key, uploads[-1][1], i)
                                  for i in range(n)])
                etags = [[p.result() for p in file_parts] for file_parts in parts]
            for (key, upload_id), tags in zip(uploads, etags, strict=True):
                self.store.complete_upload(key, upload_id, tags)
                completed.append(key)
        except BaseException:
            with using(RemoteScope()):  # clean up even past the deadline (own timeouts)
                self._undo(uploads, completed)
            raise
        shutil.rmtree(stage, ignore_errors=True)

    def _part(self, scope: RemoteScope, f: Path, key: str, upload_id: str, i: int) -> str:
        with open(f, "rb") as fh:
            fh.seek(i * PART_BYTES)
            data = fh.read(PART_BYTES)
        with using(scope):
            return str(self.store.upload_part(key, upload_id, i + 1, data))

    def _undo(self, uploads: list[tuple[str, str]], completed: list[str]) -> None:
        for key, upload_id in uploads:
            try:
                if key in completed:
                    self.store.delete(key)
                else:
                    self.store.abort_upload(key, upload_id)
            except Exception as e:  # noqa: BLE001 - best effort; the original error is raised
                log.warning("could not clean up %s: %s", key, e)

    def discard(self) -> None:
        for name, kind in self.store.entries(self.location).items():
            if kind == FILE:
                self.store.delete(join(self.location, name))

    def published_by(self, merge_id: str) -> bool:
        """Whether the output's manifest names `merge_id` (published, maybe not recorded)."""
        try:
            doc = json.loads(self.store.read_bytes(join(self.location, MANIFEST_FILE), 64 << 20))
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and doc.get("merge_id") == merge_id


    def clean_interrupted(self, merge_id: str) -> None:
        """Remove a dead run's staging and the output it published but never recorded."""
        stage = stage_dir(merge_id[2:])
        # (and the claims' stagings of a shared catalog)
        for run in stage.parent.glob(glob.escape(stage.name) + "*"):
            shutil.rmtree(run, ignore_errors=True)
        if self.published_by(merge_id):
            log.warning("removing %s: merge %s published it but died before recording it",
                        self.location, merge_id)
            self.discard()


def stage_dir(tag: str) -> Path:
    """Where the output of run `tag` is staged: MERGEPIPE_STAGING_DIR or the temp directory."""
    root = Path(os.environ.get("MERGEPIPE_STAGING_DIR") or tempfile.gettempdir())
    return root / f"mergepipe-stage-{tag}"
