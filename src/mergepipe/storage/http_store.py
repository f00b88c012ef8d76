"""A checkpoint directory behind HTTP(S) (a model hub's layout): HEAD, probed names, ranged GETs."""

from __future__ import annotations

import errno
import ipaddress
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from typing import Any

import urllib3

from mergepipe.core.errors import InvalidCheckpoint, SourceChanged
from mergepipe.storage.locations import parse_url
from mergepipe.storage.remote_io import (
    RemoteConfig,
    Transient,
    check_content_range,
    copy_body,
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


class HttpStore:
    """Files under an http(s):// base URL. A bearer token (MERGEPIPE_HTTP_TOKEN) is sent over
    HTTPS, and over plain HTTP only to a loopback host; never across a redirect to another
    host (urllib3 drops Authorization there)."""

    def __init__(self, cfg: RemoteConfig) -> None:
        self.cfg = cfg
        self._pool = urllib3.PoolManager(
            maxsize=32, timeout=urllib3.Timeout(connect=cfg.timeout_s, read=cfg.timeout_s),
            retries=urllib3.Retry(total=None, connect=0, read=0, status=0, other=0,
                                  redirect=5, raise_on_status=False))

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
        return Stamp(int(size), mtime_ns, r.headers.get("ETag"))

    def kind(self, path: str) -> str | None:
        """A URL named *.safetensors or like a checkpoint's file (PROBED_NAMES) is a file, if it
        exists; any other URL is taken as a directory (what it holds is probed by `entries`)."""
        name = parse_url(path).name
        if not name.endswith(".safetensors") and name not in PROBED_NAMES:
            return DIR
        try:
            self.stat(path)
        except FileNotFoundError:
            return None
        return FILE

    def entries(self, path: str) -> dict[str, str]:
        """The PROBED_NAMES that exist under the directory URL (HEAD requests in parallel)."""
        url = parse_url(path)
        with ThreadPoolExecutor(8, thread_name_prefix="mergepipe-probe") as pool:
            found = list(pool.map(lambda n: self._exists(str(url.child(n))), PROBED_NAMES))
        return {n: FILE for n, ok in zip(PROBED_NAMES, found, strict=True) if ok}

    def _exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, path: str, limit: int) -> bytes:
        size = self.stat(path).size
        if size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, over the limit of {limit}")
        buf = bytearray(size)
        self.read_range(path, 0, memoryview(buf), None, FetchStats())
        return bytes(buf)

    # -- byte ranges -------------------------------------------------------------------------

    def read_range(self, path: str, offset: int, out: memoryview, pin: Stamp | None,
                   stats: FetchStats) -> None:
        """Fill `out` from `offset` with ranged GETs (If-Match on a strong ETag when pinned); a
        broken or truncated body is resumed where it stopped."""
        if not len(out):
            return
        n, done = len(out), [0]
        strong = pin.etag if pin and pin.etag and not pin.etag.startswith("W/") else None

        def attempt() -> None:
            start = offset + done[0]
            stats.add(requests=1)
            headers = {"Range": f"bytes={start}-{offset + n - 1}",
                       **({"If-Match": strong} if strong else {})}
            r = self._request(path, "GET", headers)
            try:
                if r.status != 206:
                    raise InvalidCheckpoint(f"{path}: the server does not honour Range "
                                            f"requests (HTTP {r.status} to a ranged GET)")
                check_content_range(path, r.headers.get("Content-Range"), start, offset + n)
                copy_body(lambda k: _read(r, k), out, done, stats)
            finally:
                r.release_conn() if done[0] >= n else r.close()

        with_retries(f"{path} (bytes {offset}..{offset + n})", self.cfg, stats, attempt,
                     lambda: done[0])

    # -- requests ----------------------------------------------------------------------------

    def _call(self, path: str, method: str, headers: dict[str, str]) -> Any:
        stats = FetchStats()

        def attempt() -> Any:
            stats.add(requests=1)
            r = self._request(path, method, headers)
            r.release_conn()
            return r
        return with_retries(path, self.cfg, stats, attempt)

    def _request(self, path: str, method: str, headers: dict[str, str]) -> Any:
        """One request; errors by status: retried (429, 5xx), missing, refused, changed."""
        try:
            r = self._pool.request(method, path, headers={**headers, **self._auth(path)},
                                   preload_content=False)
        except urllib3.exceptions.HTTPError as e:
            raise Transient(f"{type(e).__name__}: {e}") from None
        if r.status < 400:
            return r
        r.close()
        if r.status == 429 or r.status >= 500:
            raise Transient(f"HTTP {r.status}")
        if r.status in (404, 410):
            raise FileNotFoundError(errno.ENOENT, f"no such file (HTTP {r.status})", path)
        if r.status in (401, 403):
            raise PermissionError(errno.EACCES, f"access denied (HTTP {r.status}): set "
                                  "MERGEPIPE_HTTP_TOKEN to a token that may read it", path)
        if r.status == 412:
            raise SourceChanged(f"{path} changed while it was being read (it no longer has "
                                f"ETag {headers.get('If-Match')}); re-ingest it")
        if r.status == 416:
            raise InvalidCheckpoint(f"{path}: truncated: the file ends before "
                                    f"{headers.get('Range')}")
        raise InvalidCheckpoint(f"{path}: HTTP {r.status} to {method}")

    def _auth(self, path: str) -> dict[str, str]:
        url = parse_url(path)
        if self.cfg.http_token and (url.scheme == "https" or _loopback(url.authority)):
            return {"Authorization": f"Bearer {self.cfg.http_token}"}
        return {}


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

