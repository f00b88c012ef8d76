"""The one reader interface to checkpoint storage: byte ranges by pread, every byte counted."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable
from typing import Protocol

from mergepipe.core.errors import InvalidCheckpoint


class RangeReader(Protocol):
    """What ingestion and the executor read checkpoints through: byte ranges of files, every
    byte counted (in total and per file). Local disk today; object storage plugs in here."""

    bytes_read: int
    bytes_by_path: dict[str, int]

    def size(self, path: str) -> int: ...

    def read(self, path: str, offset: int, nbytes: int) -> bytearray: ...

    def read_into(self, path: str, offset: int, out: memoryview) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> RangeReader: ...

    def __exit__(self, *exc: object) -> None: ...


def open_reader(*, random_access: bool = False) -> RangeReader:
    """A reader for checkpoint files. `random_access`: the caller reads scattered ranges in large
    reads of its own (a budgeted access set), so read-ahead would fetch bytes nobody asked for."""
    return LocalFileReader(random_access=random_access)


class LocalFileReader:
    """Reads byte ranges with os.pread from files kept open; thread-safe; counts bytes per file."""

    def __init__(self, *, random_access: bool = False) -> None:
        # random_access: the caller reads scattered ranges (a budgeted access set) in large
        # preads of its own, so kernel read-ahead would only fetch bytes nobody asked for.
        self.random_access = random_access
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.bytes_by_path: dict[str, int] = {}

    def _fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:  # O_NONBLOCK: a FIFO planted as a checkpoint must not hang the open
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                except OSError as e:
                    raise InvalidCheckpoint(f"{path}: cannot open ({e.strerror})") from None
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise InvalidCheckpoint(f"{path}: not a regular file")
                if self.random_access:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                self._fds[path] = fd
            return fd

    def size(self, path: str) -> int:
        """The file's size in bytes (it is opened, and kept open, for reading)."""
        return os.fstat(self._fd(path)).st_size

    def read(self, path: str, offset: int, nbytes: int) -> bytearray:
        buf = bytearray(nbytes)
        self.read_into(path, offset, memoryview(buf))
        return buf

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        """Fill `out` with the bytes at `offset`; a short read means the file was truncated."""
        fd = self._fd(path)
        done = 0
        n = len(out)
        while done < n:
            got = os.preadv(fd, [out[done:]], offset + done)
            if got <= 0:
                raise InvalidCheckpoint(
                    f"{path}: truncated: wanted {n} bytes at offset {offset}, file ended after "
                    f"{done}")
            done += got
        with self._lock:
            self.bytes_read += n
            self.bytes_by_path[path] = self.bytes_by_path.get(path, 0) + n

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> LocalFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drop_page_cache(paths: Iterable[str]) -> None:
    """Evict files from the page cache (cold-read benchmarks)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
