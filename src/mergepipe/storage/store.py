"""The storage seam for finding checkpoints: the local disk, or an S3 / HTTP store by URL scheme."""

from __future__ import annotations

import threading

from mergepipe.storage.fsconfine import current_roots
from mergepipe.storage.local_store import LocalStore
from mergepipe.storage.locations import is_url, parse_url
from mergepipe.storage.remote_io import RemoteConfig
from mergepipe.storage.s3_store import S3Store
from mergepipe.storage.store_types import RemoteStore, Store

_LOCAL = LocalStore()  # not confined (the CLI); a confined job gets its own
_remote: dict[tuple[str, RemoteConfig], RemoteStore] = {}
_lock = threading.Lock()


def store_for(path: str) -> Store:
    """The store that holds `path`: the local disk (confined to the current job's roots, see
    storage.fsconfine), or the S3 / HTTP store of its URL."""
    if is_url(path):
        return remote_store(path)
    roots = current_roots()
    return _LOCAL if roots is None else LocalStore(roots)


def remote_store(path: str) -> RemoteStore:
    """The S3, Hub or HTTP store for a URL: one per scheme and configuration (endpoint,
    credentials, retries: from the environment) per process."""
    scheme = parse_url(path).scheme
    cfg = RemoteConfig.from_env()
    kind = scheme if scheme in ("s3", "hf") else "http"
    with _lock:
        store = _remote.get((kind, cfg))
        if store is None:
            store = _remote[(kind, cfg)] = (S3Store(cfg) if kind == "s3" else
                                            _hub_store(cfg) if kind == "hf" else _http_store(cfg))
        return store


def _http_store(cfg: RemoteConfig) -> RemoteStore:
    # urllib3 and http.client (0.07 s) load with the first http(s):// location, not for local files
    from mergepipe.storage.http_store import HttpStore

    return HttpStore(cfg)


def _hub_store(cfg: RemoteConfig) -> RemoteStore:
    from mergepipe.storage.hub import HubStore  # huggingface_hub loads with the first hf://

    return HubStore(cfg)


def s3_store(path: str) -> S3Store:
    """The S3 store of an s3:// URL (for what only S3 does: multipart uploads, deletes)."""
    store = remote_store(path)
    assert isinstance(store, S3Store), path
    return store
