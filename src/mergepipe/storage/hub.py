"""Hugging Face Hub repositories as checkpoint locations: hf://org/name[@revision][/file]."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mergepipe.core.errors import InvalidRequest, NotFound, RemoteUnavailable
from mergepipe.storage.locations import Url, parse_url
from mergepipe.storage.remote import (
    RemoteConfig,
    RemoteScope,
    WholeReads,
    check_size,
    current_scope,
    using,
)
from mergepipe.storage.store_types import DIR, FILE, FetchStats, Stamp

DEFAULT_ENDPOINT = "https://huggingface.co"
_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubRef:
    """A location inside a Hub repository: repo id, revision (None: main) and file path."""

    repo: str
    revision: str | None
    path: str  # '' for the repository itself

    @staticmethod
    def of(url: Url) -> HubRef:
        head, _, rest = url.key.partition("/")
        name, _, revision = head.partition("@")
        if not name:
            raise InvalidRequest(f"{url}: name the repository, hf://org/name[@revision]",
                                 field="path")
        return HubRef(f"{url.authority}/{name}", revision or None, rest)

    def location(self, revision: str | None = None) -> str:
        rev = revision or self.revision
        return f"hf://{self.repo}{'@' + rev if rev else ''}{'/' + self.path if self.path else ''}"


@dataclass(frozen=True)
class Snapshot:
    """A repository at one commit: its sha and its files with their sizes."""

    repo: str
    sha: str
    files: dict[str, int]
    local: Path | None = None  # the snapshot folder of the local cache (offline)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
            ).upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> str | None:
    """The Hub cache the environment names now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None


def token() -> str | None:
    from huggingface_hub import get_token

    return os.environ.get("HF_TOKEN") or get_token()


_snapshots: dict[tuple[str, str], Snapshot] = {}
_lock = threading.Lock()


def snapshot(repo: str, revision: str | None, timeout_s: float = 30.0) -> Snapshot:
    """The repository at `revision` (a commit sha is looked up once per process)."""
    key = (repo, revision or "main")
    with _lock:
        if _SHA.match(key[1]) and key in _snapshots:
            return _snapshots[key]
    snap = _cached_snapshot(repo, revision) if offline() else _remote_snapshot(
        repo, revision, timeout_s)
    with _lock:
        _snapshots[(repo, snap.sha)] = snap
    return snap


def _remote_snapshot(repo: str, revision: str | None, timeout_s: float) -> Snapshot:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"hf://{repo}{'@' + revision if revision else ''}"
    try:
        info = HfApi(endpoint=endpoint(), token=token()).model_info(
            repo, revision=revision, files_metadata=True, timeout=timeout_s)
    except RevisionNotFoundError:
        raise NotFound(f"{where}: no such revision on the Hub", field="path") from None
    except RepositoryNotFoundError:
        raise NotFound(f"{where}: no such repository on the Hub (or it needs a token: "
                       "HF_TOKEN)", field="path") from None
    except (HfHubHTTPError, OSError) as e:
        raise RemoteUnavailable(f"{where}: the Hub does not answer ({type(e).__name__})",
                                field="path") from None
    if not info.sha or not _SHA.match(info.sha):
        raise RemoteUnavailable(f"{where}: the Hub gave no commit sha", field="path")
    files = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    return Snapshot(repo, info.sha, files)


def _cached_snapshot(repo: str, revision: str | None) -> Snapshot:
    """HF_HUB_OFFLINE: the snapshot of the local cache (no network at all)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo, revision=revision, local_files_only=True,
                                        cache_dir=cache_dir()))
    except (LocalEntryNotFoundError, OSError):
        raise NotFound(f"hf://{repo}{'@' + revision if revision else ''}: not in the local "
                       "Hub cache, and HF_HUB_OFFLINE is set", field="path") from None
    files = {str(p.relative_to(folder)): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return Snapshot(repo, folder.name, files, folder)


def pin(location: str) -> str:
    """hf://org/name[@revision][/file] at its commit sha."""
    ref = HubRef.of(parse_url(location))
    if ref.revision is not None and _SHA.match(ref.revision):
        return location
    return ref.location(snapshot(ref.repo, ref.revision).sha)


class HubStore(WholeReads):
    """The files of Hub repositories (the Store protocol, and byte ranges)."""

    def __init__(self, cfg: RemoteConfig) -> None:
        from mergepipe.storage.http_store import HttpStore

        self.cfg = cfg
        # the token goes to the Hub's own origin (HttpStore's rule), never to its storage host
        self.http = HttpStore(dataclasses.replace(cfg, http_token=token()))

    def _resolve(self, path: str) -> tuple[HubRef, Snapshot]:
        ref = HubRef.of(parse_url(path))
        return ref, snapshot(ref.repo, ref.revision, self.cfg.timeout_s)

    def kind(self, path: str) -> str | None:
        ref, snap = self._resolve(path)
        if not ref.path or any(f.startswith(ref.path + "/") for f in snap.files):
            return DIR
        return FILE if ref.path in snap.files else None

    def entries(self, path: str) -> dict[str, str]:
        ref, snap = self._resolve(path)
        prefix = ref.path + "/" if ref.path else ""
        out: dict[str, str] = {}
        for f in snap.files:
            if f.startswith(prefix):
                head, sep, _ = f[len(prefix):].partition("/")
                out[head] = DIR if sep else FILE
        return out

    def stat(self, path: str) -> Stamp:
        ref, snap = self._resolve(path)
        if ref.path not in snap.files:
            raise FileNotFoundError(2, f"{ref.path!r} is not a file of {snap.repo}@{snap.sha}")
        # a commit's files never change: the sha is the version (no If-Match on the storage)
        return Stamp(check_size(path, snap.files[ref.path]), 0, None)

    def read_range(self, path: str, offset: int, out: memoryview, pin: Stamp | None,
                   stats: FetchStats) -> None:
        """From the local cache when the file is there, else ranged GETs of its resolve URL."""
        ref, snap = self._resolve(path)
        local = _cached_file(snap, ref.path)
        if local is not None:
            _pread(local, offset, out, stats)
            return
        if offline():
            raise NotFound(f"{path}: not in the local Hub cache, and HF_HUB_OFFLINE is set",
                           field="path")
        url = f"{endpoint()}/{snap.repo}/resolve/{snap.sha}/{ref.path}"
        with self._scope():
            self.http.read_range(url, offset, out, None, stats)

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        """In a confined job, each hf://org root admits that organization's resolve URLs."""
        scope = current_scope()
        if scope.roots is None:
            yield
            return
        base = parse_url(endpoint(), "HF_ENDPOINT")
        extra = tuple(Url(base.scheme, base.authority,
                          f"{base.key}/{r.authority}" if base.key else r.authority)
                      for r in scope.roots if r.scheme == "hf")
        with using(RemoteScope(scope.roots + extra, scope.deadline, scope.limit_s)):
            yield


def _cached_file(snap: Snapshot, file: str) -> Path | None:
    if snap.local is not None:
        return snap.local / file
    from huggingface_hub import try_to_load_from_cache

    found: Any = try_to_load_from_cache(snap.repo, file, revision=snap.sha,
                                        cache_dir=cache_dir())
    return Path(found) if isinstance(found, str) else None


def _pread(path: Path, offset: int, out: memoryview, stats: FetchStats) -> None:
    with open(path, "rb") as f:  # a buffered readinto reads on to the end of `out` or the file
        f.seek(offset)
        if f.readinto(out) < len(out):
            raise OSError(5, f"{path}: the cached file ended early")
    stats.add(nbytes=len(out), requests=1)
