"""The types of the storage seam: file stamps, fetch counters, and what a store must do."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

# What an entry of a directory is: a regular file, a directory, or something else (a FIFO...).
FILE, DIR, OTHER = "file", "dir", "other"


@dataclass(frozen=True)
class Stamp:
    """A file as read: size, mtime (ns; a remote Last-Modified), and a remote ETag / version id."""

    size: int
    mtime_ns: int
    etag: str | None = None
    version_id: str | None = None

    def change_from(self, recorded: Stamp) -> str | None:
        """How this differs from `recorded` (None: the same file): by version id if recorded,
        else ETag, else size and mtime."""
        if self.size != recorded.size:
            return f"size {recorded.size} -> {self.size}"
        if recorded.version_id is not None:
            return None if self.version_id == recorded.version_id else \
                f"version {recorded.version_id} -> {self.version_id}"
        if recorded.etag is not None:
            return None if self.etag == recorded.etag else f"ETag {recorded.etag} -> {self.etag}"
        if self.mtime_ns != recorded.mtime_ns:
            return f"mtime_ns {recorded.mtime_ns} -> {self.mtime_ns}"
        return None


class FetchStats:
    """What reading one file cost: body bytes fetched, requests made, retries among them."""

    def __init__(self) -> None:
        self.bytes = self.requests = self.retries = 0
        self._lock = threading.Lock()

    def add(self, *, nbytes: int = 0, requests: int = 0, retries: int = 0) -> None:
        with self._lock:
            self.bytes += nbytes
            self.requests += requests
            self.retries += retries

    def to_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "requests": self.requests, "retries": self.retries}


# Every body byte this process fetched from remote storage (the service's metrics read it).
NETWORK = FetchStats()


class Store(Protocol):
    """What discovering a checkpoint needs; missing: FileNotFoundError, refused: PermissionError."""

    def stat(self, path: str) -> Stamp: ...

    def kind(self, path: str) -> str | None: ...  # FILE, DIR, OTHER or None (nothing there)

    def entries(self, path: str) -> dict[str, str]: ...  # name -> kind, of a directory

    def read_bytes(self, path: str, limit: int) -> bytes: ...  # a whole small file


class RemoteStore(Store, Protocol):
    """A store that also serves byte ranges (local ones are LocalFileReader's)."""

    def read_range(self, path: str, offset: int, out: memoryview, pin: Stamp | None,
                   stats: FetchStats) -> None: ...
