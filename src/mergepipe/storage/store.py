"""The store of a location: the local disk (confined to a job's roots), or the remote store of a URL."""

from __future__ import annotations

import importlib
import os
import stat
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mergepipe.core.errors import Forbidden
from mergepipe.storage.fsconfine import current_roots, open_confined
from mergepipe.storage.locations import is_url, parse_url
from mergepipe.storage.store_types import DIR, FILE, OTHER, RemoteStore, Stamp, Store

if TYPE_CHECKING:
    from mergepipe.storage.remote import RemoteConfig
    from mergepipe.storage.s3_store import S3Store

_PATH = getattr(os, "O_PATH", os.O_RDONLY)


def _kind(mode: int) -> str:
    return FILE if stat.S_ISREG(mode) else DIR if stat.S_ISDIR(mode) else OTHER


class LocalStore:
    """Files on this machine; with `roots` (a confined job) opened beneath their root."""

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
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(0, "not a regular file")
            if st.st_size > limit:
                raise OSError(0, f"{st.st_size} bytes, over the limit of {limit}")
            with open(fd, "rb", closefd=False) as f:
                data = f.read(limit + 1)  # one that grew while read: refused
        finally:
            os.close(fd)
        if len(data) > limit:
            raise OSError(0, f"over the limit of {limit} bytes")
        return data


_REMOTE_CLASSES = {"s3": ("mergepipe.storage.s3_store", "S3Store"),
                   "hf": ("mergepipe.storage.hub", "HubStore"),
                   "http": ("mergepipe.storage.http_store", "HttpStore")}
_LOCAL = LocalStore()  # not confined (the CLI); a confined job gets its own
_remote: dict[tuple[str, RemoteConfig], RemoteStore] = {}
_lock = threading.Lock()


def store_for(path: str) -> Store:
    """The store holding `path`: the local disk (confined to the job's roots) or a remote one."""
    if is_url(path):
        return remote_store(path)
    roots = current_roots()
    return _LOCAL if roots is None else LocalStore(roots)


def remote_store(path: str) -> RemoteStore:
    """The S3, Hub or HTTP store of a URL: one per scheme and configuration per process."""
    from mergepipe.storage.remote import RemoteConfig

    scheme = parse_url(path).scheme
    cfg = RemoteConfig.from_env()
    kind = scheme if scheme in ("s3", "hf") else "http"
    with _lock:
        store = _remote.get((kind, cfg))
        if store is None:
            # each client library (boto3, urllib3, huggingface_hub) loads with its first URL
            module, cls = _REMOTE_CLASSES[kind]
            store = _remote[(kind, cfg)] = getattr(importlib.import_module(module), cls)(cfg)
        return store


def s3_store(path: str) -> S3Store:
    from mergepipe.storage.s3_store import S3Store

    store = remote_store(path)
    assert isinstance(store, S3Store), path
    return store
