"""A full output disk is a 507 with a message a user can act on: checked when a merge is
accepted (free space against the output's size, from the catalog), and any write that runs out
of space later (another writer filled the disk) fails the merge with the same kind of error."""

from __future__ import annotations

import contextlib
import errno
import math
import os
from collections.abc import Iterator
from pathlib import Path

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import find_model, model_tensors
from mergepipe.core.errors import InsufficientStorage
from mergepipe.core.request import MergeRequest
from mergepipe.core.vocab import DTYPE_SIZES

NO_SPACE = {errno.ENOSPC: "the output disk is full", errno.EDQUOT: "the disk quota is used up",
            errno.EFBIG: "an output file is over the file-size limit"}
SIDE_ROOM = 1 << 20  # manifest, model card, index and config beside the weights, about
ADVICE = ("free space there, or write the output elsewhere (another output root: "
          "MERGEPIPE_OUTPUT_ROOT; the CLI: --out)")


def output_bytes(cat: Catalog, request: MergeRequest) -> int | None:
    """The bytes of the merge's weights (the base's tensors in the output dtype); None while
    the base is not registered yet (an ingestion queued with the merge)."""
    row = find_model(cat, request.base)
    if row is None or row.status != "ready":
        return None
    return sum(math.prod(t.shape) * DTYPE_SIZES[request.output_dtype or t.dtype]
               for t in model_tensors(cat, request.base))


def free_bytes(path: Path) -> tuple[Path, int]:
    """(the nearest existing directory at or above `path`, bytes free to us there)."""
    d = Path(path).absolute()
    while not d.is_dir() and d != d.parent:
        d = d.parent
    st = os.statvfs(d)
    return d, st.f_bavail * st.f_frsize


def check_space(cat: Catalog, request: MergeRequest, out_dir: Path) -> None:
    """InsufficientStorage unless the disk of `out_dir` has room for the output (local
    outputs; the staging directory is beside the output, on the same disk)."""
    need = output_bytes(cat, request)
    if need is None:
        return
    where, free = free_bytes(out_dir)
    if free < need + SIDE_ROOM:
        raise InsufficientStorage(
            f"not enough disk space for the output: it needs about {need + SIDE_ROOM} bytes "
            f"and {where} has {free} free; {ADVICE}", field="output")


@contextlib.contextmanager
def out_of_space_is_507(out_dir: Path) -> Iterator[None]:
    """Turn a write that found the disk full (or over a quota or file-size limit) into
    InsufficientStorage naming the output's disk."""
    try:
        yield
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        where, free = free_bytes(Path(out_dir).parent)
        raise InsufficientStorage(
            f"{NO_SPACE[e.errno]}: {e.strerror} while writing the output under {where} "
            f"({free} bytes free now); nothing was published; {ADVICE}",
            field="output") from None
