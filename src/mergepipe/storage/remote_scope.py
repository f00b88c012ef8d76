"""The remote scope of a job: the roots every redirect must stay under, and the job's deadline.

A job of the service runs inside `remote_scope(roots, limit_s)`. Every request of the remote
stores then (1) follows a redirect only to a URL under a remote root, checked hop by hop before
it is followed, and (2) ends by the job's deadline: each attempt's timeouts are capped by the
time left, retries and their backoff stop at it, and a request still running at it (a server
trickling its headers or body) is cut off. Outside a scope (the CLI) any redirect is followed
and nothing but the per-read timeout applies. Pools of reading threads carry the scope of the
thread that made them (`using`).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mergepipe.core.errors import JobTimeout
from mergepipe.storage.locations import Url, parse_url


@dataclass(frozen=True)
class RemoteScope:
    """Where remote requests may lead, and until when they may run."""

    roots: tuple[Url, ...] | None = None  # None: any URL (the CLI)
    deadline: float | None = None         # time.monotonic() by which every call ends
    limit_s: float | None = None          # the job's time limit, for messages

    def allows(self, url: Url, start: Url) -> bool:
        """Whether a request for `start` may be redirected to `url`: under a remote root. A
        URL outside every root (a model an administrator registered from the CLI) is read as
        on the CLI, like a local path outside the data roots."""
        if self.roots is None or not any(start.within(r) for r in self.roots):
            return True
        return any(url.within(r) for r in self.roots)

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def cap(self, seconds: float) -> float:
        """`seconds`, but no more than the time left (at least a millisecond)."""
        left = self.remaining()
        return seconds if left is None else max(0.001, min(seconds, left))

    def check(self, what: str) -> None:
        """JobTimeout naming `what` once the deadline has passed."""
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
    """Run the body under `scope` (a reading thread, on behalf of the job that made it)."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def remote_scope(roots: Sequence[str] | None, limit_s: float | None
                 ) -> contextlib.AbstractContextManager[None]:
    """A job's scope: redirects confined to `roots` (None: not confined), every remote call
    over within `limit_s` seconds from now (None: no deadline)."""
    parsed = None if roots is None else tuple(parse_url(r, "MERGEPIPE_REMOTE_ROOTS")
                                               for r in roots)
    deadline = None if limit_s is None else time.monotonic() + limit_s
    return using(RemoteScope(parsed, deadline, limit_s))
