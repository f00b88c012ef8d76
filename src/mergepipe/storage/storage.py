"""The one reader interface to checkpoint storage: byte ranges (local pread, remote ranged GETs), every byte counted."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.storage.fsconfine import current_roots, open_confined
from mergepipe.storage.locations import is_url
from mergepipe.storage.remote_reader import RemoteReader
from mergepipe.storage.store_types import ByteReader, FetchStats, Stamp


class RangeReader(Protocol):
    """What ingestion and the executor read checkpoints through: byte ranges of files, every
    byte counted (in total and per file): local files and remote objects (s3://, https://).
    Local files are opened beneath their root when the reader was made in a confined job."""

    @property
    def bytes_read(self) -> int: ...

    @property
    def bytes_by_path(self) -> dict[str, int]: ...

    def size(self, path: str) -> int: ...

    def read(self, path: str, offset: int, nbytes: int) -> bytearray: ...

    def read_into(self, path: str, offset: int, out: memoryview) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> RangeReader: ...

    def __exit__(self, *exc: object) -> None: ...


def open_reader(*, random_access: bool = False) -> SourceReader:
    """A reader for checkpoint files. `random_access`: the caller reads scattered ranges in large
    reads of its own (a budgeted access set), so read-ahead would fetch bytes nobody asked for."""
    return SourceReader(LocalFileReader(random_access=random_access),
                        RemoteReader(read_ahead=not random_access))


class SourceReader(ByteReader):
    """Dispatch by scheme: local paths to a LocalFileReader, URLs to a RemoteReader; the
    counters cover both (for local files a request is one read call, never retried)."""

    def __init__(self, local: LocalFileReader, remote: RemoteReader) -> None:
        self.local, self.remote = local, remote
        self._local_reads: dict[str, int] = {}
        self._lock = threading.Lock()

    def _for(self, path: str) -> LocalFileReader | RemoteReader:
        return self.remote if is_url(path) else self.local

    @property
    def bytes_read(self) -> int:
        return self.local.bytes_read + self.remote.bytes_read

    @property
    def bytes_by_path(self) -> dict[str, int]:
        return {**self.local.bytes_by_path, **self.remote.bytes_by_path}

    def fetch_stats(self) -> dict[str, FetchStats]:
        """Bytes, requests and retries per file read."""
        out = self.remote.fetch_stats()
        for path, n in self.local.bytes_by_path.items():
            out[path] = st = FetchStats()
            st.add(nbytes=n, requests=self._local_reads.get(path, 0))
        return out

    def pin(self, path: str, stamp: Stamp) -> None:
        """Read a remote object at the version `stamp` names (local files: no-op)."""
        if is_url(path):
            self.remote.pin(path, stamp)

    def size(self, path: str) -> int:
        return self._for(path).size(path)

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        reader = self._for(path)
        reader.read_into(path, offset, out)
        if reader is self.local:
            with self._lock:
                self._local_reads[path] = self._local_reads.get(path, 0) + 1

    def close(self) -> None:
        self.local.close()
        self.remote.close()


class LocalFileReader(ByteReader):
    """Reads byte ranges with os.pread from files kept open; thread-safe; counts bytes per file."""

    def __init__(self, *, random_access: bool = False) -> None:
        # random_access: the caller reads scattered ranges (a budgeted access set) in large
        # preads of its own, so kernel read-ahead would only fetch bytes nobody asked for.
        self.random_access = random_access
        self.roots = current_roots()  # the job's roots, captured for the reading threads
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.bytes_by_path: dict[str, int] = {}

    def _fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = open_source(path, self.roots)
                if self.random_access:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                self._fds[path] = fd
            return fd

    def size(self, path: str) -> int:
        """The file's size in bytes (it is opened, and kept open, for reading)."""
        return os.fstat(self._fd(path)).st_size

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


def open_source(path: str, roots: Sequence[str] | None) -> int:
    """A read-only fd of a checkpoint file, beneath its root in a confined job; a regular file
    only."""
    try:  # O_NONBLOCK: a FIFO planted as a checkpoint must not hang the open
        fd = open_confined(path, os.O_RDONLY | os.O_NONBLOCK, roots)
    except OSError as e:
        raise InvalidCheckpoint(f"{path}: cannot open ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidCheckpoint(f"{path}: not a regular file")
    return fd


def drop_page_cache(paths: Iterable[str]) -> None:
    """Evict files from the page cache (cold-read benchmarks)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
