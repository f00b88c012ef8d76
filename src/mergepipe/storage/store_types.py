"""The types of the storage seam: file stamps, fetch counters, and what a store must do."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, Self

# What an entry of a directory is: a regular file, a directory, or something else (a FIFO...).
FILE, DIR, OTHER = "file", "dir", "other"


@dataclass(frozen=True)
class Stamp:
    """How a file looked when it was read: size and modification time (ns; a remote object's
    Last-Modified), and for remote objects the ETag and version id the store gave."""

    size: int
    mtime_ns: int
    etag: str | None = None
    version_id: str | None = None

    def change_from(self, recorded: Stamp) -> str | None:
        """How this stamp differs from the `recorded` one (None: the same file). The version
        id decides where one was recorded, else the ETag, else size and modification time."""
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
    """What discovering a checkpoint needs of the place it lives in. Missing objects raise
    FileNotFoundError, refused ones PermissionError (both OSError, with a strerror)."""

    def stat(self, path: str) -> Stamp: ...

    def kind(self, path: str) -> str | None: ...  # FILE, DIR, OTHER or None (nothing there)

    def entries(self, path: str) -> dict[str, str]: ...  # name -> kind, of a directory

    def read_bytes(self, path: str, limit: int) -> bytes: ...  # a whole small file


class RemoteStore(Store, Protocol):
    """A store that also serves byte ranges (the local one leaves those to LocalFileReader)."""

    def read_range(self, path: str, offset: int, out: memoryview, pin: Stamp | None,
                   stats: FetchStats) -> None: ...


class ByteReader(ABC):
    """`read` and `with` (closing at the block's end) for a reader of byte ranges."""

    @abstractmethod
    def read_into(self, path: str, offset: int, out: memoryview) -> None:
        ...

    @abstractmethod
    def close(self) -> None:
        ...

    def read(self, path: str, offset: int, nbytes: int) -> bytearray:
        buf = bytearray(nbytes)
        self.read_into(path, offset, memoryview(buf))
        return buf

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
