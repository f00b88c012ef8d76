"""Byte ranges of remote objects (S3, HTTP) by ranged GETs, each object read at one version, counted."""

from __future__ import annotations

import threading

from mergepipe.catalog.store import remote_store
from mergepipe.catalog.store_types import FetchStats, Stamp
from mergepipe.core.errors import InvalidCheckpoint


class RemoteReader:
    """A RangeReader over URLs. Each object is read at one version: the one pinned by the
    caller (its stamp at ingestion), else the one its first stat saw; reads ask the store for
    exactly that version (VersionId / If-Match), so a changed object fails, never mixes.
    Counts per object the response-body bytes fetched, the requests and the retries."""

    def __init__(self) -> None:
        self._stats: dict[str, FetchStats] = {}
        self._pins: dict[str, Stamp] = {}
        self._lock = threading.Lock()

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
            st = remote_store(path).stat(path)
        except OSError as e:
            raise InvalidCheckpoint(f"{path}: cannot open ({e.strerror})") from None
        with self._lock:
            return self._pins.setdefault(path, st)

    def size(self, path: str) -> int:
        return self.stamp(path).size

    def read(self, path: str, offset: int, nbytes: int) -> bytearray:
        buf = bytearray(nbytes)
        self.read_into(path, offset, memoryview(buf))
        return buf

    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        with self._lock:
            stats = self._stats.setdefault(path, FetchStats())
            pin = self._pins.get(path)
        try:
            remote_store(path).read_range(path, offset, out, pin, stats)
        except OSError as e:
            raise InvalidCheckpoint(f"{path}: cannot read ({e.strerror})") from None

    def close(self) -> None:
        pass

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
