"""Atomic publish: build the output in a hidden directory beside the target, fsync, rename."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mergepipe.core.errors import Conflict, InvalidRequest


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
    """The hidden temporary directory beside `target` used for a run tagged `tag`."""
    return target.parent / f".{target.name}.tmp-{tag}"


def prepare(target: Path, tag: str, *, overwrite: bool = False) -> Path:
    """Check the target and create an empty staging directory beside it."""
    target = Path(target).absolute()
    if not target.name:
        raise InvalidRequest(f"output {target} has no directory name", field="output")
    check_target(target, overwrite=overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = staging_dir(target, tag)
    if os.path.lexists(stage):
        shutil.rmtree(stage)
    stage.mkdir()
    return stage


def publish(stage: Path, target: Path, *, overwrite: bool = False) -> Path:
    """fsync everything in `stage` and rename it to `target` (one step: all or nothing)."""
    target = Path(target).absolute()
    for f in stage.iterdir():
        if f.is_file():
            _fsync_path(f, os.O_RDONLY)
    _fsync_path(stage, os.O_RDONLY)
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
    _fsync_path(target.parent, os.O_RDONLY)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def discard(path: Path) -> None:
    """Remove a staging (or unpublished) directory, ignoring what is already gone."""
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def staged(target: Path, tag: str, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a staging directory; publish it on normal exit, discard it on any exception."""
    stage = prepare(target, tag, overwrite=overwrite)
    try:
        yield stage
        publish(stage, target, overwrite=overwrite)
    except BaseException:
        discard(stage)
        raise


def _fsync_path(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
