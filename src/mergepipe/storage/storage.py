"""Reading checkpoint bytes: local preads and remote ranged GETs (read-ahead, pinned versions)."""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.storage.fsconfine import current_roots, open_confined
from mergepipe.storage.locations import is_url
from mergepipe.storage.remote import current_scope, using
from mergepipe.storage.store import remote_store
from mergepipe.storage.store_types import FetchStats, Stamp

WINDOW_BYTES = 8 << 20  # a sequential reader fetches objects in windows this large
WINDOWS_AHEAD = 2       # ... and this many windows ahead of the one being read
MAX_WINDOWS = 6         # memory: at most this many windows held at once (48 MiB)


def open_reader(*, random_access: bool = False) -> RangeReader:
    """A reader of checkpoint files; `random_access`: no read-ahead (scattered large reads)."""
    return RangeReader(random_access=random_access)


class RangeReader:
    """Byte ranges of local files (LocalFileReader) and URLs (RemoteReader), every byte counted."""

    def __init__(self, *, random_access: bool = False) -> None:
        self.local = LocalFileReader(random_access=random_access)
        self.remote = RemoteReader(read_ahead=not random_access)

    @property
    def bytes_read(self) -> int:
        return sum(s.bytes for s in self.fetch_stats().values())

    @property
    def bytes_by_path(self) -> dict[str, int]:
        return {p: s.bytes for p, s in self.fetch_stats().items()}

    def fetch_stats(self) -> dict[str, FetchStats]:
        """Per file: bytes read (fetched), reads (requests) and retries."""
        return {**self.local.stats, **self.remote.stats}

    def pin(self, path: str, stamp: Stamp) -> None:
        if is_url(path):
            self.remote.pin(path, stamp)

    def size(self, path: str) -> int:
        return (self.remote if is_url(path) else self.local).size(path)

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        (self.remote if is_url(path) else self.local).read_into(path, offset, out)

    def read(self, path: str, offset: int, nbytes: int) -> bytearray:
        buf = bytearray(nbytes)
        self.read_into(path, offset, memoryview(buf))
        return buf

    def close(self) -> None:
        self.local.close()
        self.remote.close()

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalFileReader:
    """Reads byte ranges with os.pread from files kept open; thread-safe; counts bytes per file."""

    def __init__(self, *, random_access: bool = False) -> None:
        self.random_access = random_access
        self.roots = current_roots()  # the job's roots, captured for the reading threads
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.stats: dict[str, FetchStats] = {}

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
        return os.fstat(self._fd(path)).st_size

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
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
            stats = self.stats.setdefault(path, FetchStats())
        stats.add(nbytes=n, requests=1)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


class RemoteReader:
    """A RangeReader over URLs, in the remote scope of the thread that made it."""

    def __init__(self, *, read_ahead: bool = False) -> None:
        self.scope = current_scope()
        self.stats: dict[str, FetchStats] = {}
        self._pins: dict[str, Stamp] = {}
        self._lock = threading.Lock()
        self._ahead = _ReadAhead(self) if read_ahead else None

    def pin(self, path: str, stamp: Stamp) -> None:
        with self._lock:
            self._pins[path] = stamp

    def stamp(self, path: str) -> Stamp:
        """The pinned stamp of `path` (stat and pinned on first use)."""
        with self._lock:
            pinned = self._pins.get(path)
        if pinned is not None:
            return pinned
        try:
            with using(self.scope):
                st = remote_store(path).stat(path)
        except OSError as e:
            raise InvalidCheckpoint(f"{path}: cannot open ({e.strerror})") from None
        with self._lock:
            return self._pins.setdefault(path, st)

    def size(self, path: str) -> int:
        return self.stamp(path).size

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        if self._ahead is not None:
            self._ahead.read_into(path, offset, out)
        else:
            self.fetch(path, offset, out)

    def fetch(self, path: str, offset: int, out: memoryview) -> None:
        """Fill `out` with exactly these bytes from the store (counted)."""
        with self._lock:
            stats = self.stats.setdefault(path, FetchStats())
            pin = self._pins.get(path)
        try:
            with using(self.scope):
                remote_store(path).read_range(path, offset, out, pin, stats)
        except OSError as e:
            raise InvalidCheckpoint(f"{path}: cannot read ({e.strerror})") from None

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()


class _ReadAhead:
    """Windows of WINDOW_BYTES from each object's first offset read, fetched once, kept."""

    def __init__(self, reader: RemoteReader) -> None:
        self.reader = reader
        self._anchors: dict[str, int] = {}
        self._windows: OrderedDict[tuple[str, int], Future[bytearray]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(WINDOWS_AHEAD, thread_name_prefix="mergepipe-ahead")

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        with self._lock:
            anchor = self._anchors.setdefault(path, offset)
        if offset < anchor:  # behind the stream (rare): read exactly
            return self.reader.fetch(path, offset, out)
        pos, end = offset, offset + len(out)
        while pos < end:
            k = (pos - anchor) // WINDOW_BYTES
            start = anchor + k * WINDOW_BYTES
            for ahead in range(1, WINDOWS_AHEAD + 1):
                self._window(path, k + ahead, anchor, wait=False)
            window = self._window(path, k, anchor, wait=True)
            n = min(end, start + len(window)) - pos
            if n <= 0:
                raise InvalidCheckpoint(f"{path}: truncated: wanted {len(out)} bytes at offset "
                                        f"{offset}, the object ends at {start + len(window)}")
            out[pos - offset: pos - offset + n] = window[pos - start: pos - start + n]
            pos += n

    def _window(self, path: str, k: int, anchor: int, *, wait: bool) -> bytearray:
        key, start, size = (path, k), anchor + k * WINDOW_BYTES, self.reader.size(path)
        if start >= size and not wait:
            return bytearray()
        with self._lock:
            fut = self._windows.get(key)
            mine = fut is None
            if fut is None:
                fut = self._windows[key] = Future()
                while len(self._windows) > MAX_WINDOWS:
                    self._windows.popitem(last=False)
            else:
                self._windows.move_to_end(key)
        if mine:
            nbytes = max(0, min(WINDOW_BYTES, size - start))
            if wait:
                self._fill(fut, path, start, nbytes)
            else:
                self._pool.submit(self._fill, fut, path, start, nbytes)
        return fut.result() if wait else bytearray()

    def _fill(self, fut: Future[bytearray], path: str, start: int, nbytes: int) -> None:
        buf = bytearray(nbytes)
        try:
            self.reader.fetch(path, start, memoryview(buf))
        except BaseException as e:
            with self._lock:  # a failed window is fetched again by the next reader
                for key, f in list(self._windows.items()):
                    if f is fut:
                        del self._windows[key]
            fut.set_exception(e)
            return
        fut.set_result(buf)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def open_source(path: str, roots: Sequence[str] | None) -> int:
    """A read-only fd of a regular checkpoint file, beneath its root in a confined job."""
    try:  # O_NONBLOCK: a FIFO planted as a checkpoint must not hang the open
        fd = open_confined(path, os.O_RDONLY | os.O_NONBLOCK, roots)
    except OSError as e:
        raise InvalidCheckpoint(f"{path}: cannot open ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidCheckpoint(f"{path}: not a regular file")
    return fd


def drop_page_cache(paths: Iterable[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
