"""Byte ranges of remote objects (S3, HTTP) by ranged GETs, each object read at one version, counted."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from mergepipe.core.errors import InvalidCheckpoint
from mergepipe.storage.remote_scope import current_scope, using
from mergepipe.storage.store import remote_store
from mergepipe.storage.store_types import ByteReader, FetchStats, Stamp

WINDOW_BYTES = 8 << 20  # a sequential reader fetches objects in windows this large
WINDOWS_AHEAD = 2       # ... and this many windows ahead of the one being read
MAX_WINDOWS = 6         # memory: at most this many windows held at once (48 MiB)


class RemoteReader(ByteReader):
    """A RangeReader over URLs. Each object is read at one version: the one pinned by the
    caller (its stamp at ingestion), else the one its first stat saw; reads ask the store for
    exactly that version (VersionId / If-Match), so a changed object fails, never mixes.
    Counts per object the response-body bytes fetched, the requests and the retries.

    `read_ahead`: the caller reads objects front to back (ingestion, the base of a merge), so
    each is fetched in large windows from the first offset asked for, a few windows ahead, in
    parallel; otherwise (a budgeted access set) exactly the ranges asked for are fetched.

    Requests run in the remote scope of the thread that made the reader (its job's roots and
    deadline), whichever thread reads."""

    def __init__(self, *, read_ahead: bool = False) -> None:
        self.scope = current_scope()
        self._stats: dict[str, FetchStats] = {}
        self._pins: dict[str, Stamp] = {}
        self._lock = threading.Lock()
        self._ahead = _ReadAhead(self) if read_ahead else None

    @property
    def bytes_read(self) -> int:
        return sum(s.bytes for s in list(self._stats.values()))

    @property
    def bytes_by_path(self) -> dict[str, int]:
        return {p: s.bytes for p, s in list(self._stats.items())}

    def fetch_stats(self) -> dict[str, FetchStats]:
        return dict(self._stats)

    def pin(self, path: str, stamp: Stamp) -> None:
        """Read `path` at the version `stamp` describes (its ETag / version id)."""
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
            stats = self._stats.setdefault(path, FetchStats())
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
    """Windows of WINDOW_BYTES from the first offset read of each object, fetched once each
    (WINDOWS_AHEAD ahead, in parallel) and served from memory (MAX_WINDOWS at most)."""

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
