"""Side files of an output: the base's config, generation config and tokenizer files, copied by
name from the allow-list of files a Hugging Face model directory holds, each under a size cap.

Anything else in the base's directory (other weights, scripts, data, a planted 100 MiB sparse
file) is left out and listed, with the reason, in the manifest. A local file is opened once,
beneath its data root in a confined job (storage.fsconfine), and copied from that descriptor,
data extents only: a sparse file's holes stay holes in the output, never written densely.
`config.json` gets the output dtype.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.core.vocab import HF_DTYPE_NAMES
from mergepipe.executor.writer import pwrite_all, write_json, write_new
from mergepipe.storage import bounded_json
from mergepipe.storage.fsconfine import current_roots, open_confined
from mergepipe.storage.locations import basename, is_url
from mergepipe.storage.store import store_for
from mergepipe.storage.store_types import FILE

CONFIG_FILE = "config.json"
_KIB, _MIB = 1 << 10, 1 << 20
# The files a model directory holds beside its weights, with the largest size copied of each
# (far above real ones: a 256k-token tokenizer.json is about 35 MB).
SIDE_FILES: dict[str, int] = {
    CONFIG_FILE: 16 * _MIB,
    "generation_config.json": 1 * _MIB,
    "tokenizer.json": 128 * _MIB,
    "tokenizer_config.json": 16 * _MIB,
    "special_tokens_map.json": 1 * _MIB,
    "added_tokens.json": 16 * _MIB,
    "tokenizer.model": 32 * _MIB,
    "spiece.model": 32 * _MIB,
    "sentencepiece.bpe.model": 32 * _MIB,
    "vocab.json": 32 * _MIB,
    "vocab.txt": 32 * _MIB,
    "merges.txt": 32 * _MIB,
    "chat_template.jinja": 1 * _MIB,
    "chat_template.json": 1 * _MIB,
    "preprocessor_config.json": 1 * _MIB,
    "processor_config.json": 1 * _MIB,
    "LICENSE": 1 * _MIB,
    "LICENSE.txt": 1 * _MIB,
    "LICENSE.md": 1 * _MIB,
    "NOTICE": 1 * _MIB,
    "USE_POLICY.md": 1 * _MIB,
}
COPY_CHUNK = 1 * _MIB  # bytes read and written at a time


@dataclass
class SideFiles:
    """What became of the base's non-weight files: copied (names), left out (name, reason)."""

    copied: list[str] = field(default_factory=list)
    left_out: list[dict[str, str]] = field(default_factory=list)


def copy_side_files(paths: list[str], out_dir: Path, dtype: str | None) -> SideFiles:
    """Copy the allowed side files among `paths` (local or remote) into `out_dir`."""
    out = SideFiles()
    for p in paths:
        name = basename(p)
        cap = SIDE_FILES.get(name)
        if cap is None:
            out.left_out.append({"name": name, "reason": "not a model-directory side file "
                                 "(config, generation config, tokenizer, chat template, "
                                 "license)"})
            continue
        try:
            why = (_copy_remote if is_url(p) else _copy_local)(p, out_dir / name, cap, dtype)
        except OSError as e:
            raise InvalidCheckpoint(f"{p}: cannot copy it ({e.strerror or e})") from None
        if why is None:
            out.copied.append(name)
        else:
            out.left_out.append({"name": name, "reason": why})
    return out


def read_config(paths: list[str]) -> dict[str, Any] | None:
    """The config.json among a checkpoint's side files `paths` (local or remote), as a JSON
    object; None when it has none, or it is too large or not a JSON object."""
    p = next((q for q in paths if basename(q) == CONFIG_FILE), None)
    if p is None:
        return None
    cap = SIDE_FILES[CONFIG_FILE]
    try:
        if is_url(p):
            data = store_for(p).read_bytes(p, cap)
        else:
            fd = open_confined(p, os.O_RDONLY | os.O_NONBLOCK, current_roots())
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
                    return None
                data = b"".join(c for _, c in _chunks(fd, 0, st.st_size, p))
            finally:
                os.close(fd)
        doc = bounded_json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _too_large(size: int, cap: int) -> str:
    return f"{size} bytes, over the {cap}-byte cap for this file"


def _copy_remote(p: str, dst: Path, cap: int, dtype: str | None) -> str | None:
    store = store_for(p)
    if store.kind(p) != FILE:
        return "not a regular file"
    try:
        data = store.read_bytes(p, cap)
    except OSError as e:
        if e.errno == errno.EFBIG:
            return _too_large(store.stat(p).size, cap)
        raise
    _write(dst, data, dtype)
    return None


def _copy_local(p: str, dst: Path, cap: int, dtype: str | None) -> str | None:
    # O_NONBLOCK: a FIFO planted as a tokenizer file must not hang the open
    fd = open_confined(p, os.O_RDONLY | os.O_NONBLOCK, current_roots())
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_size > cap:
            return _too_large(st.st_size, cap)
        if dst.name == CONFIG_FILE and dtype is not None:
            _write(dst, b"".join(c for _, c in _chunks(fd, 0, st.st_size, p)), dtype)
        else:
            _copy_extents(fd, st.st_size, dst, p)
        return None
    finally:
        os.close(fd)


def _chunks(fd: int, begin: int, end: int, p: str) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes) of [begin, end) of `fd`, read COPY_CHUNK at a time."""
    pos = begin
    while pos < end:
        chunk = os.pread(fd, min(COPY_CHUNK, end - pos), pos)
        if not chunk:
            raise OSError(errno.EIO, f"shrank while copied (ended at {pos} bytes)", p)
        yield pos, chunk
        pos += len(chunk)


def _copy_extents(fd: int, size: int, dst: Path, p: str) -> None:
    """Copy the data extents of `fd` (SEEK_DATA / SEEK_HOLE; the whole file where the file
    system does not say) into a new file of the same size: holes are not written."""
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o644)
    try:
        os.ftruncate(out, size)
        for begin, end in _extents(fd, size):
            for pos, chunk in _chunks(fd, begin, end, p):
                pwrite_all(out, chunk, pos)
        os.fsync(out)
    finally:
        os.close(out)


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """[begin, end) of each data extent of a file of `size` bytes."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(0, size)] if size else []
    out = []
    pos = 0
    try:
        while pos < size:
            try:
                begin = os.lseek(fd, pos, seek_data)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole from here to the end
                    break
                raise
            end = min(os.lseek(fd, begin, seek_hole), size)
            if end > begin:
                out.append((begin, end))
            pos = end
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole support: copy it all
            return [(0, size)] if size else []
        raise
    return out


def _write(dst: Path, data: bytes, dtype: str | None) -> None:
    if not (dst.name == CONFIG_FILE and dtype is not None and _write_config(data, dst, dtype)):
        write_new(dst, data)


def _write_config(data: bytes, dst: Path, dtype: str) -> bool:
    """config.json with the output dtype; False if it is not a JSON object (copied as is)."""
    try:
        cfg = bounded_json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or numbers too long to convert
        return False
    if not isinstance(cfg, dict):
        return False
    cfg["torch_dtype"] = HF_DTYPE_NAMES[dtype]
    if "dtype" in cfg:
        cfg["dtype"] = HF_DTYPE_NAMES[dtype]
    write_json(dst, cfg)
    return True
