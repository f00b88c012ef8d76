"""What every remote store shares: the job's remote scope, settings, retries, ranged reads."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TypeVar

from mergepipe.core import checkpoint_limits
from mergepipe.core.errors import InvalidCheckpoint, JobTimeout, RemoteUnavailable, SourceChanged
from mergepipe.core.settings import env_number
from mergepipe.storage.locations import Url, parse_url
from mergepipe.storage.store_types import NETWORK, FetchStats, Stamp

T = TypeVar("T")
# What one ranged GET gives: its Content-Range header and a reader of its body (n bytes at most).
RangedBody = tuple[str | None, Callable[[int], bytes]]
MAX_BACKOFF_S = 8.0
CHUNK_BYTES = 1 << 20  # a response body is copied into the caller's buffer this much at a time
# AWS variables that select the S3 client (its credentials are read by boto3 itself).
AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION",
                 "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP", "AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE")


@dataclass(frozen=True)
class RemoteScope:
    """Where remote requests may lead, and until when they may run."""

    roots: tuple[Url, ...] | None = None  # None: any URL (the CLI)
    deadline: float | None = None         # time.monotonic() by which every call ends
    limit_s: float | None = None          # the job's time limit, for messages

    def allows(self, url: Url, start: Url) -> bool:
        """Whether a request for `start` may be redirected to `url`."""
        if self.roots is None or not any(start.within(r) for r in self.roots):
            return True
        return any(url.within(r) for r in self.roots)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def cap(self, seconds: float) -> float:
        left = self.remaining()
        return seconds if left is None else max(0.001, min(seconds, left))

    def check(self, what: str) -> None:
        left = self.remaining()
        if left is not None and left <= 0:
            raise JobTimeout(f"{what}: the job ran past its time limit of {self.limit_s:g} s "
                             "(MERGEPIPE_JOB_TIMEOUT_S) waiting on the remote store")


_UNSCOPED = RemoteScope()
_SCOPE: contextvars.ContextVar[RemoteScope | None] = contextvars.ContextVar(
    "mergepipe_remote_scope", default=None)


def current_scope() -> RemoteScope:
    return _SCOPE.get() or _UNSCOPED


@contextlib.contextmanager
def using(scope: RemoteScope) -> Iterator[None]:
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def remote_scope(roots: Sequence[str] | None, limit_s: float | None
                 ) -> contextlib.AbstractContextManager[None]:
    """A job's scope: redirects confined to `roots`, every call over within `limit_s` s."""
    parsed = None if roots is None else tuple(parse_url(r, "MERGEPIPE_REMOTE_ROOTS")
                                               for r in roots)
    deadline = None if limit_s is None else time.monotonic() + limit_s
    return using(RemoteScope(parsed, deadline, limit_s))


class Transient(Exception):
    """A failure worth retrying: a timeout, a reset connection, a truncated body, 429 or 5xx."""


@dataclass(frozen=True)
class RemoteConfig:
    """Attempts, backoff, timeout (per connect and read), the HTTP token and the AWS variables."""

    attempts: int = 5
    backoff_s: float = 0.25
    timeout_s: float = 30.0
    http_token: str | None = field(default=None, repr=False)
    aws: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> RemoteConfig:
        e = dict(os.environ if env is None else env)
        return RemoteConfig(
            attempts=env_number(e, "MERGEPIPE_REMOTE_ATTEMPTS", int, 5, 1),
            backoff_s=env_number(e, "MERGEPIPE_REMOTE_BACKOFF_S", float, 0.25, 0.0),
            timeout_s=env_number(e, "MERGEPIPE_REMOTE_TIMEOUT_S", float, 30.0, 0.01),
            http_token=e.get("MERGEPIPE_HTTP_TOKEN") or None,
            aws=tuple((k, e[k]) for k in AWS_VARIABLES if e.get(k)))

    def aws_value(self, name: str) -> str | None:
        return dict(self.aws).get(name)

    def backoff(self, failures: int) -> float:
        return random.uniform(0, min(MAX_BACKOFF_S, self.backoff_s * 2 ** (failures - 1)))


def raise_for_status(path: str, status: int, label: str, thing: str, denied_hint: str,
                     if_match: str | None, byte_range: str | None) -> None:
    """The error an HTTP status means (S3's too): retried (429, 5xx), missing, refused, changed
    or truncated; any other status is left to the caller."""
    if status == 429 or status >= 500:
        raise Transient(label)
    if status in (404, 410):
        raise FileNotFoundError(errno.ENOENT, f"no such {thing} ({label})", path)
    if status in (401, 403):
        raise PermissionError(errno.EACCES, f"access denied ({label}): {denied_hint}", path)
    if status == 412:
        raise SourceChanged(f"{path} changed while it was being read (it no longer has ETag "
                            f"{if_match}); re-ingest it")
    if status == 416:
        raise InvalidCheckpoint(f"{path}: truncated: the {thing} ends before {byte_range}")


def check_size(path: str, size: int) -> int:
    """`size` as a store claims it, refused over MERGEPIPE_MAX_FILE_BYTES before any read."""
    cap = checkpoint_limits.current().max_file_bytes
    if size > cap:
        raise InvalidCheckpoint(f"{path}: the store claims {size} bytes, over the limit of {cap} "
                                "for one file (MERGEPIPE_MAX_FILE_BYTES)", field="path")
    return size


def with_retries(what: str, cfg: RemoteConfig, stats: FetchStats, attempt: Callable[[], T],
                 progress: Callable[[], int] = lambda: 0) -> T:
    """Run `attempt` until it succeeds, retrying Transient failures after a backoff, within the
    job's deadline. An attempt that made `progress` (bytes) resets the count of failures in a
    row; `cfg.attempts` in a row give up with RemoteUnavailable."""
    failures, seen, scope = 0, progress(), current_scope()
    while True:
        scope.check(what)
        try:
            return attempt()
        except Transient as e:
            scope.check(what)  # an attempt cut off at the deadline is not retried
            now = progress()
            failures = 1 if now > seen else failures + 1
            seen = now
            if failures >= cfg.attempts:
                raise RemoteUnavailable(f"{what}: {e}; gave up after {failures} "
                                        "attempts in a row") from None
            stats.add(retries=1)
            time.sleep(scope.cap(cfg.backoff(failures)))


def copy_body(read: Callable[[int], bytes], out: memoryview, done: list[int],
              stats: FetchStats) -> None:
    """Copy a body into `out[done[0]:]` as it arrives; one ending early is Transient."""
    n, scope = len(out), current_scope()
    while done[0] < n:
        left = scope.remaining()
        if left is not None and left <= 0:
            raise Transient("the job's deadline passed while the body was arriving")
        chunk = read(min(CHUNK_BYTES, n - done[0]))
        if not chunk:
            raise Transient(f"the body ended after {done[0]} of {n} bytes")
        out[done[0]: done[0] + len(chunk)] = chunk
        done[0] += len(chunk)
        stats.add(nbytes=len(chunk))
        NETWORK.add(nbytes=len(chunk))


def check_content_range(path: str, content_range: str | None, start: int, end: int) -> None:
    """The response to a ranged GET covers [start, end): `bytes start-(end-1)/total`."""
    unit, _, rest = (content_range or "").partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    if not (unit == "bytes" and first.isdigit() and last.isdigit()):
        raise InvalidCheckpoint(f"{path}: the store answered a ranged GET without a valid "
                                f"Content-Range ({content_range!r})")
    if total.isdigit() and int(total) < end:
        raise InvalidCheckpoint(f"{path}: truncated: wanted bytes up to {end}, the object has "
                                f"{total}")
    if int(first) != start or int(last) != end - 1:
        raise InvalidCheckpoint(f"{path}: the store answered bytes {span} to a request for "
                                f"{start}..{end - 1}")


class WholeReads(ABC):
    """`read_bytes` of a remote store, from its `stat` and `read_range`."""

    @abstractmethod
    def stat(self, path: str) -> Stamp: ...

    @abstractmethod
    def read_range(self, path: str, offset: int, out: memoryview, pin: Stamp | None,
                   stats: FetchStats) -> None: ...

    def read_bytes(self, path: str, limit: int) -> bytes:
        size = self.stat(path).size
        if size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, over the limit of {limit}")
        buf = bytearray(size)
        self.read_range(path, 0, memoryview(buf), None, FetchStats())
        return bytes(buf)


class RangedReads(WholeReads):
    """`read_range` of a store that answers ranged GETs (`_ranged`), with retries."""

    cfg: RemoteConfig

    @abstractmethod
    def _ranged(self, path: str, start: int, end: int, pin: Stamp | None
                ) -> AbstractContextManager[RangedBody]:
        """One GET of bytes [start, end) of `path` (of the pinned version)."""

    def read_range(self, path: str, offset: int, out: memoryview, pin: Stamp | None,
                   stats: FetchStats) -> None:
        """Fill `out` from `offset`; a broken or truncated body is resumed where it stopped."""
        if not len(out):
            return
        n, done = len(out), [0]

        def attempt() -> None:
            start = offset + done[0]
            stats.add(requests=1)
            with self._ranged(path, start, offset + n, pin) as (content_range, read):
                check_content_range(path, content_range, start, offset + n)
                copy_body(read, out, done, stats)

        with_retries(f"{path} (bytes {offset}..{offset + n})", self.cfg, stats, attempt,
                     lambda: done[0])
