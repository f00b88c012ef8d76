"""The local disk as a store: stat, list a directory, read a small file (symbolic links followed)."""

from __future__ import annotations

import os
import stat

from mergepipe.catalog.store_types import DIR, FILE, OTHER, Stamp


def _kind(mode: int) -> str:
    return FILE if stat.S_ISREG(mode) else DIR if stat.S_ISDIR(mode) else OTHER


class LocalStore:
    """Files on this machine; byte ranges are LocalFileReader's (catalog.storage)."""

    def stat(self, path: str) -> Stamp:
        st = os.stat(path)
        return Stamp(st.st_size, st.st_mtime_ns)

    def kind(self, path: str) -> str | None:
        try:
            return _kind(os.stat(path).st_mode)
        except FileNotFoundError:
            return None

    def entries(self, path: str) -> dict[str, str]:
        out = {}
        with os.scandir(path) as it:
            for e in it:
                try:
                    out[e.name] = _kind(os.stat(e.path).st_mode)
                except OSError:  # a dangling link: listed, not readable
                    out[e.name] = OTHER
        return out

    def read_bytes(self, path: str, limit: int) -> bytes:
        # O_NONBLOCK: a FIFO planted as a JSON file must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(0, "not a regular file")
            if st.st_size > limit:
                raise OSError(0, f"{st.st_size} bytes, over the limit of {limit}")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
