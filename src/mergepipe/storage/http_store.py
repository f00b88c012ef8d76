"""A checkpoint directory behind HTTP(S): HEAD, probed names, ranged GETs; the deadline watchdog."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from mergepipe.core.errors import Forbidden, InvalidCheckpoint, InvalidRequest
from mergepipe.storage.locations import Url, parse_url
from mergepipe.storage.remote import (
    RangedBody,
    RangedReads,
    RemoteConfig,
    RemoteScope,
    Transient,
    check_size,
    current_scope,
    raise_for_status,
    using,
    with_retries,
)
from mergepipe.storage.store_types import DIR, FILE, FetchStats, Stamp

# HTTP cannot list a directory: these are the names a hub checkpoint directory uses.
PROBED_NAMES = (
    "adapter_config.json", "adapter_model.safetensors", "model.safetensors",
    "model.safetensors.index.json", "config.json", "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja",
)
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
MAX_LOCATION_CHARS = 8192


# A server trickling its headers or body answers each read within any timeout: only a clock ends
# such a request. At the deadline the watchdog shuts the socket down through a duplicate of its
# descriptor (so that a TLS handshake in progress is cut off too).
class Watch:
    """One request's deadline: a timer that shuts down the connection the request is using."""

    def __init__(self, deadline: float) -> None:
        self.fired = False
        self._conn: Any = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = threading.Timer(
            max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def attach(self, conn: Any) -> None:
        with self._lock:
            if self._timer is None:  # closed
                return
            self._conn = conn
            fired = self.fired
        if fired:
            _shutdown(conn)

    def _fire(self) -> None:
        with self._lock:
            if self._timer is None:
                return
            self.fired = True
            conn = self._conn
        if conn is not None:
            _shutdown(conn)

    def close(self) -> None:
        with self._lock:
            timer, self._timer, self._conn = self._timer, None, None
        if timer is not None:
            timer.cancel()


def _shutdown(conn: Any) -> None:
    """Shut the socket down: ours through its duplicate descriptor, boto3's through its socket."""
    sock = getattr(conn, "_watch_dup", None) or getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):  # closed already
            sock.shutdown(socket.SHUT_RDWR)


CURRENT = threading.local()  # .watch: the Watch of the request this thread is making


@contextlib.contextmanager
def watching(conn: Any, deadline: float | None) -> Iterator[Watch | None]:
    """Cut `conn` off at `deadline` while the body runs (None: no deadline, nothing watched)."""
    if deadline is None or conn is None:
        yield None
        return
    w = Watch(deadline)
    w.attach(conn)
    try:
        yield w
    finally:
        w.close()


class _Watched:
    """Connection mixin: attach to the thread's watch on connect and on every request."""

    _watch_dup: socket.socket | None = None

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        self._watch_dup = sock.dup()
        _attach(self)
        return sock

    def request(self, *args: Any, **kw: Any) -> None:
        _attach(self)
        super().request(*args, **kw)  # type: ignore[misc]

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        dup, self._watch_dup = self._watch_dup, None
        if dup is not None:
            dup.close()


def _attach(conn: Any) -> None:
    w = getattr(CURRENT, "watch", None)
    if w is not None:
        w.attach(conn)


class _HTTPConnection(_Watched, HTTPConnection):
    pass


class _HTTPSConnection(_Watched, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


POOL_CLASSES: dict[str, type[HTTPConnectionPool]] = {"http": _HTTPPool, "https": _HTTPSPool}


class HttpStore(RangedReads):
    """Files under an http(s):// base URL."""

    def __init__(self, cfg: RemoteConfig) -> None:
        self.cfg = cfg
        self._pool = urllib3.PoolManager(
            maxsize=32, timeout=urllib3.Timeout(connect=cfg.timeout_s, read=cfg.timeout_s),
            retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0,
                                  redirect=False, raise_on_status=False))
        self._pool.pool_classes_by_scheme = POOL_CLASSES

    # -- discovery ---------------------------------------------------------------------------

    def stat(self, path: str) -> Stamp:
        r = self._call(path, "HEAD", {})
        size = r.headers.get("Content-Length")
        if size is None or not size.isdigit():
            raise InvalidCheckpoint(f"{path}: the server gives no Content-Length")
        modified = r.headers.get("Last-Modified")
        try:
            mtime_ns = int(parsedate_to_datetime(modified).timestamp() * 1e9) if modified else 0
        except (TypeError, ValueError):
            mtime_ns = 0
        return Stamp(check_size(path, int(size)), mtime_ns, r.headers.get("ETag"))

    def kind(self, path: str) -> str | None:
        """A URL named like a checkpoint's file is a file if it exists; any other a directory."""
        name = parse_url(path).name
        if not name.endswith(".safetensors") and name not in PROBED_NAMES:
            return DIR
        try:
            self.stat(path)
        except FileNotFoundError:
            return None
        return FILE

    def entries(self, path: str) -> dict[str, str]:
        """The PROBED_NAMES that exist under the directory URL (HEADs in parallel)."""
        url, scope = parse_url(path), current_scope()

        def exists(name: str) -> bool:
            with using(scope):
                return self.kind(str(url.child(name))) == FILE

        with ThreadPoolExecutor(8, thread_name_prefix="mergepipe-probe") as pool:
            found = list(pool.map(exists, PROBED_NAMES))
        return {n: FILE for n, ok in zip(PROBED_NAMES, found, strict=True) if ok}

    # -- byte ranges -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _ranged(self, path: str, start: int, end: int, pin: Stamp | None
                ) -> Iterator[RangedBody]:
        """A ranged GET, If-Match on a strong ETag when pinned."""
        strong = pin.etag if pin and pin.etag and not pin.etag.startswith("W/") else None
        headers = {"Range": f"bytes={start}-{end - 1}", **({"If-Match": strong} if strong else {})}
        with self._open(path, "GET", headers) as r:
            if r.status != 206:
                raise InvalidCheckpoint(f"{path}: the server does not honour Range "
                                        f"requests (HTTP {r.status} to a ranged GET)")
            yield r.headers.get("Content-Range"), lambda k: _read(r, k)

    # -- requests ----------------------------------------------------------------------------

    def _call(self, path: str, method: str, headers: dict[str, str]) -> Any:
        """A request without a body to read (HEAD), with retries."""
        stats = FetchStats()

        def attempt() -> Any:
            stats.add(requests=1)
            with self._open(path, method, headers) as r:
                return r
        return with_retries(path, self.cfg, stats, attempt)

    @contextlib.contextmanager
    def _open(self, path: str, method: str, headers: dict[str, str]) -> Iterator[Any]:
        """One request, watched until its body is done; pooled again only if read out."""
        scope = current_scope()
        watch = Watch(scope.deadline) if scope.deadline is not None else None
        CURRENT.watch = watch
        r = None
        try:
            r = self._follow(path, method, headers, scope)
            if watch is not None and watch.fired:  # cut off mid-headers: not an answer
                raise Transient("cut off at the job's deadline")
            _check_status(path, method, headers, r)
            yield r
        finally:
            CURRENT.watch = None
            if watch is not None:
                watch.close()
            if r is not None:
                if r.length_remaining == 0 and not (watch is not None and watch.fired):
                    r.release_conn()
                else:
                    r.close()

    def _follow(self, path: str, method: str, headers: dict[str, str],
                scope: RemoteScope) -> Any:
        """The response, following redirects hop by hop, each checked before it is requested."""
        start = parse_url(path)
        url, query, trusted = start, "", True
        for hop in range(MAX_REDIRECTS + 1):
            target = str(url) + (f"?{query}" if query else "")
            auth = self._auth(url) if trusted else {}
            r = self._send(method, target, {**headers, **auth}, scope, hopped=hop > 0)
            if r.status not in REDIRECTS:
                return r
            location = r.headers.get("Location")
            r.close()  # never drained: a redirect's body may trickle
            if not location:
                raise InvalidCheckpoint(f"{path}: HTTP {r.status} without a Location")
            url, query = _hop(path, target, location, start, scope)
            trusted = trusted and url.origin == start.origin
        raise InvalidCheckpoint(f"{path}: more than {MAX_REDIRECTS} redirects")

    def _send(self, method: str, target: str, headers: dict[str, str], scope: RemoteScope,
              *, hopped: bool) -> Any:
        t = scope.cap(self.cfg.timeout_s)
        try:
            return self._pool.request(method, target, headers=headers, preload_content=False,
                                      redirect=False, timeout=urllib3.Timeout(connect=t, read=t))
        except urllib3.exceptions.HTTPError as e:
            # after a redirect the reason is not told: where it led is not for the caller to
            # learn (a redirect to a closed port must not tell it from an open one)
            raise Transient(f"{type(e).__name__} after a redirect" if hopped
                            else f"{type(e).__name__}: {e}") from None

    def _auth(self, url: Url) -> dict[str, str]:
        if self.cfg.http_token and (url.scheme == "https" or _loopback(url.authority)):
            return {"Authorization": f"Bearer {self.cfg.http_token}"}
        return {}


def _hop(path: str, current: str, location: str, start: Url, scope: RemoteScope
         ) -> tuple[Url, str]:
    """The next URL and query of a redirect, under the scope's roots, else Forbidden (unnamed)."""
    refused = Forbidden(f"{path}: the server redirected the request to a location outside the "
                        "allowed remote roots; the redirect was not followed", field="path")
    if len(location) > MAX_LOCATION_CHARS or any(ord(c) <= 32 or ord(c) == 127
                                                 for c in location):
        raise refused
    head, _, query = urljoin(current, location).split("#", 1)[0].partition("?")
    try:
        url = parse_url(head, "redirect")
    except InvalidRequest:
        raise refused from None
    if not scope.allows(url, start):
        raise refused
    return url, query


def _check_status(path: str, method: str, headers: dict[str, str], r: Any) -> None:
    """Errors by status: retried (429, 5xx), missing, refused, changed."""
    if r.status < 400 and r.status not in REDIRECTS:
        return
    raise_for_status(path, r.status, f"HTTP {r.status}", "file",
                     "set MERGEPIPE_HTTP_TOKEN to a token that may read it",
                     headers.get("If-Match"), headers.get("Range"))
    raise InvalidCheckpoint(f"{path}: HTTP {r.status} to {method}")


def _read(r: Any, nbytes: int) -> bytes:
    try:
        return bytes(r.read(nbytes))
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise Transient(f"reading the body: {type(e).__name__}: {e}") from None


def _loopback(authority: str) -> bool:
    host = authority.rsplit(":", 1)[0] if not authority.startswith("[") else \
        authority[1:authority.index("]")]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

