"""A Hugging Face Hub of the tests' own on loopback: the repo-info API (siblings, sizes, commit
sha), resolve URLs that answer 302 to a second storage server for .safetensors files (with
X-Repo-Commit, ETag, X-Linked-Etag and X-Linked-Size, as the Hub does) and 200 for small files,
and a storage server that serves ranged GETs. Both count the requests and body bytes they send.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass
class Repo:
    files: dict[str, bytes]
    sha: str

    @staticmethod
    def from_dir(folder: Path, sha: str | None = None) -> Repo:
        """The folder's files as a repo; its commit sha derived from their names and bytes
        unless given (as a real commit's: a process caches what it read at a sha, so two tests
        serving other files at one sha would see each other's)."""
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        if sha is None:
            h = hashlib.sha1()
            for name, data in files.items():
                h.update(f"{name}\0{len(data)}\0".encode())
                h.update(data)
            sha = h.hexdigest()
        return Repo(files, sha)


@dataclass
class FakeHub:
    """Repos by id; the endpoint and storage URLs once started; what each server sent."""

    repos: dict[str, Repo]
    endpoint: str = ""
    storage: str = ""
    requests: Counter[str] = field(default_factory=Counter)  # "hub" | "storage" -> count
    body_bytes: Counter[str] = field(default_factory=Counter)  # storage: repo id -> bytes
    lock: threading.Lock = field(default_factory=threading.Lock)

    def blob(self, digest: str) -> tuple[str, bytes] | None:
        """(repo id, bytes) of the file with this sha256."""
        for repo_id, repo in self.repos.items():
            for data in repo.files.values():
                if hashlib.sha256(data).hexdigest() == digest:
                    return repo_id, data
        return None

    def network_requests(self) -> int:
        with self.lock:
            return sum(self.requests.values())


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


def _send_ranged(h: BaseHTTPRequestHandler, data: bytes, headers: dict[str, str]) -> int:
    """200 with the whole body, or 206 with the Range asked for; the body bytes sent."""
    rng = _RANGE.match(h.headers.get("Range", ""))
    status, body = 200, data
    if rng:
        start = int(rng.group(1))
        end = int(rng.group(2)) if rng.group(2) else len(data) - 1
        body = data[start:end + 1]
        status = 206
        headers = {**headers, "Content-Range": f"bytes {start}-{start + len(body) - 1}/{len(data)}"}
    _send(h, status, body, {**headers, "Accept-Ranges": "bytes"})
    return len(body) if h.command == "GET" else 0


_INFO = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


def _find_repo(hub: FakeHub, repo_id: str, revision: str) -> Repo | None:
    repo = hub.repos.get(repo_id)
    return repo if repo is not None and revision in ("main", repo.sha) else None


def _info(hub: FakeHub, repo_id: str, revision: str) -> tuple[int, bytes, dict[str, str]]:
    """The model info answer: (status, body, headers)."""
    repo = _find_repo(hub, repo_id, revision)
    if repo is None:
        code = "RevisionNotFound" if repo_id in hub.repos else "RepoNotFound"
        return 404, b"{}", {"X-Error-Code": code}
    body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": repo.sha,
                       "private": False, "siblings": _siblings(repo)}).encode()
    return 200, body, {"Content-Type": "application/json"}


def _siblings(repo: Repo) -> list[dict[str, object]]:
    """The Hub's file list of a repository: LFS fields for the safetensors files."""
    return [{"rfilename": n, "size": len(d), "blobId": hashlib.sha1(d).hexdigest(),
             **({"lfs": {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d),
                         "pointerSize": 134}}
                if n.endswith(".safetensors") else {})}
            for n, d in sorted(repo.files.items())]


class _Quiet(BaseHTTPRequestHandler):
    """A handler that logs nothing and answers HEAD as GET."""

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        raise NotImplementedError  # each server's handler answers GET


def _counted(hub: FakeHub, server: str) -> None:
    with hub.lock:
        hub.requests[server] += 1


def _hub_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_GET(self) -> None:
            _counted(hub, "hub")
            path = unquote(urlparse(self.path).path)
            info = _INFO.match(path)
            resolve = _RESOLVE.match(path)
            if info:
                self._info(info.group(1), info.group(2) or "main")
            elif resolve:
                self._resolve(resolve.group(1), resolve.group(2), resolve.group(3))
            else:
                _send(self, 404, b'{"error": "not found"}', {"Content-Type": "application/json"})

        def _info(self, repo_id: str, revision: str) -> None:
            _send(self, *_info(hub, repo_id, revision))

        def _resolve(self, repo_id: str, revision: str, name: str) -> None:
            repo = _find_repo(hub, repo_id, revision)
            if repo is None or name not in repo.files:
                return _send(self, 404, b"", {"X-Error-Code": "EntryNotFound"})
            data = repo.files[name]
            digest = hashlib.sha256(data).hexdigest()
            common = {"X-Repo-Commit": repo.sha, "ETag": f'"{digest}"'}
            if name.endswith(".safetensors"):
                return _send(self, 302, b"", {
                    **common, "Location": f"{hub.storage}/blobs/{digest}",
                    "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data))})
            _send_ranged(self, data, common)

    return Handler


def _storage_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_GET(self) -> None:
            _counted(hub, "storage")
            m = re.match(r"^/blobs/([0-9a-f]{64})$", urlparse(self.path).path)
            found = hub.blob(m.group(1)) if m else None
            if found is None:
                return _send(self, 404, b"", {})
            repo_id, data = found
            sent = _send_ranged(self, data, {"ETag": f'"{m.group(1)}"'})  # type: ignore[union-attr]
            with hub.lock:
                hub.body_bytes[repo_id] += sent

    return Handler


@contextmanager
def serve(hub: FakeHub) -> Iterator[FakeHub]:
    """Start the Hub and its storage server on loopback ports; stop both after."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _hub_handler(hub)),
               ThreadingHTTPServer(("127.0.0.1", 0), _storage_handler(hub))]
    hub.endpoint = f"http://127.0.0.1:{servers[0].server_address[1]}"
    hub.storage = f"http://127.0.0.1:{servers[1].server_address[1]}"
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield hub
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()



@contextmanager
def serve_as_hub(hub: FakeHub, cache: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[FakeHub]:
    """serve(hub) as the Hub the code under test reaches: HF_ENDPOINT at it, HF_HUB_CACHE at
    `cache`, online and without a token."""
    with serve(hub) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield h

def fill_cache(cache: Path, repo_id: str, repo: Repo) -> None:
    """The Hub cache layout huggingface_hub writes (blobs, a snapshot of links, refs/main)."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(repo.sha)
    snap = root / "snapshots" / repo.sha
    snap.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    for name, data in repo.files.items():
        digest = hashlib.sha256(data).hexdigest()
        (root / "blobs" / digest).write_bytes(data)
        link = snap / name
        if not link.exists():
            link.symlink_to(Path("..") / ".." / "blobs" / digest)
