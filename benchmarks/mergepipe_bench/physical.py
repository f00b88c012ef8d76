"""The physical limit: time `cat`/`dd` to read exactly a run's input byte ranges and write its output size."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog, register_sql_package
from mergepipe_bench.proc import Timed, run_timed

register_sql_package("mergepipe_bench")
DD_BLOCK = 4 << 20


@dataclass(frozen=True)
class ByteRange:
    """`nbytes` at `offset` of `path`."""

    path: str
    offset: int
    nbytes: int


def run_ranges(cat: Catalog, merge_id: str, base: str) -> tuple[list[ByteRange], list[ByteRange]]:
    """(expert ranges, base ranges) a recorded merge read, from its touched blocks and the base."""
    experts = [_range(r._mapping) for r in cat.query("bench_expert_ranges", {"merge_id": merge_id})]
    base_ranges = [_range(r._mapping) for r in cat.query("bench_model_ranges", {"model": base})]
    return experts, base_ranges


def _range(row: Mapping[Any, Any]) -> ByteRange:
    return ByteRange(str(row["path"]), int(row["offset"]), int(row["nbytes"]))


def coalesce(ranges: list[ByteRange]) -> list[ByteRange]:
    """Merge ranges of one file that touch or overlap (sorted by file and offset)."""
    out: list[ByteRange] = []
    for r in sorted(ranges, key=lambda r: (r.path, r.offset)):
        last = out[-1] if out else None
        if last is not None and last.path == r.path and last.offset + last.nbytes >= r.offset:
            end = max(last.offset + last.nbytes, r.offset + r.nbytes)
            out[-1] = ByteRange(last.path, last.offset, end - last.offset)
        else:
            out.append(r)
    return out


def script(ranges: list[ByteRange], write_bytes: int, out_file: Path, *,
           fsync: bool = True) -> tuple[str, int]:
    """A shell script reading every range (whole files: `cat`, parts: `dd`) then writing
    `write_bytes` of zeros (fsync'ed like our output); returns it and the bytes it reads."""
    lines, whole, read = ["set -e"], [], 0
    for r in coalesce(ranges):
        size = os.path.getsize(r.path)
        if r.offset <= 4096 * 64 and r.offset + r.nbytes == size:  # all but the header
            whole.append(r.path)
            read += size
        else:
            lines.append(f"dd if={shlex.quote(r.path)} of=/dev/null bs={DD_BLOCK} status=none "
                         f"iflag=skip_bytes,count_bytes skip={r.offset} count={r.nbytes}")
            read += r.nbytes
    if whole:
        lines.insert(1, "cat " + " ".join(map(shlex.quote, whole)) + " > /dev/null")
    if write_bytes:
        conv = " conv=fsync" if fsync else ""
        lines.append(f"dd if=/dev/zero of={shlex.quote(str(out_file))} bs={DD_BLOCK} "
                     f"iflag=count_bytes count={write_bytes} status=none{conv}")
    return "\n".join(lines) + "\n", read


def run_physical(ranges: list[ByteRange], write_bytes: int, workdir: Path) -> tuple[Timed, int]:
    """Run the cat/dd script in a child shell (cold cache is the caller's job); (timing, bytes read)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out_file = workdir / "cat-output.bin"
    text, nread = script(ranges, write_bytes, out_file)
    (workdir / "cat.sh").write_text(text)
    try:
        return run_timed(["bash", str(workdir / "cat.sh")]).check(), nread
    finally:
        out_file.unlink(missing_ok=True)
