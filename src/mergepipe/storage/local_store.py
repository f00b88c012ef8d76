"""The local disk as a store: stat, list a directory, read a small file (beneath a root when confined)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from mergepipe.core.errors import Forbidden
from mergepipe.storage.fsconfine import open_confined
from mergepipe.storage.store_types import DIR, FILE, OTHER, Stamp

_PATH = getattr(os, "O_PATH", os.O_RDONLY)


def _kind(mode: int) -> str:
    return FILE if stat.S_ISREG(mode) else DIR if stat.S_ISDIR(mode) else OTHER


class LocalStore:
    """Files on this machine; byte ranges are LocalFileReader's (storage.storage). With `roots`
    (a confined job) every path inside a root is resolved beneath it (storage.fsconfine)."""

    def __init__(self, roots: Sequence[str] | None = None) -> None:
        self.roots = roots

    def _fstat(self, path: str) -> os.stat_result:
        if not self.roots:
            return os.stat(path)
        fd = open_confined(path, _PATH, self.roots)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def stat(self, path: str) -> Stamp:
        st = self._fstat(path)
        return Stamp(st.st_size, st.st_mtime_ns)

    def kind(self, path: str) -> str | None:
        try:
            return _kind(self._fstat(path).st_mode)
        except FileNotFoundError:
            return None

    def entries(self, path: str) -> dict[str, str]:
        if not self.roots:
            with os.scandir(path) as it:
                names = [e.name for e in it]
        else:
            fd = open_confined(path, os.O_RDONLY | os.O_DIRECTORY, self.roots)
            try:
                names = os.listdir(fd)
            finally:
                os.close(fd)
        out = {}
        for name in names:
            try:
                out[name] = _kind(self._fstat(os.path.join(path, name)).st_mode)
            except Forbidden:
                raise
            except OSError:  # a dangling link: listed, not readable
                out[name] = OTHER
        return out

    def read_bytes(self, path: str, limit: int) -> bytes:
        # O_NONBLOCK: a FIFO planted as a JSON file must not hang the open
        fd = open_confined(path, os.O_RDONLY | os.O_NONBLOCK, self.roots)
        try:
            return read_fd(fd, limit)
        finally:
            os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """The whole of a regular file open at `fd`, refused over `limit` bytes."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(0, "not a regular file")
    if st.st_size > limit:
        raise OSError(0, f"{st.st_size} bytes, over the limit of {limit}")
    chunks = []
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if total > limit:
            raise OSError(0, f"over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
