"""Cut off an HTTP request still running at its job's deadline.

A server that trickles its headers or body (a byte every few seconds) answers each read within
any read timeout, so only a clock can end such a request. Each watched request registers its
deadline with one watchdog thread; the connections it uses (urllib3 connection classes of our
own) attach themselves to the request's watch when they connect or send, and at the deadline
the watchdog shuts the socket down (through a duplicate of its descriptor, so that a TLS
handshake in progress is cut off too): the blocked read fails at once, and the retry loop sees
the deadline has passed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class Watch:
    """One request's deadline and the connection it is using now."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self._conn: Any = None
        self._done = False
        self._lock = threading.Lock()

    def attach(self, conn: Any) -> None:
        with self._lock:
            if self._done:
                return
            self._conn = conn
            fired = self.fired
        if fired:
            _shutdown(conn)

    def fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            conn = self._conn
        if conn is not None:
            _shutdown(conn)

    def close(self) -> None:
        with self._lock:
            self._done = True
            self._conn = None


def _shutdown(conn: Any) -> None:
    """Shut the connection's socket down: our connections through their duplicate descriptor,
    another client's (boto3's, while its caller holds the response) through its socket."""
    sock = getattr(conn, "_watch_dup", None) or getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):  # closed already
            sock.shutdown(socket.SHUT_RDWR)


class Watchdog:
    """One daemon thread that fires the watches whose deadline has passed."""

    def __init__(self) -> None:
        self._active: set[Watch] = set()
        self._cond = threading.Condition()
        self._next: float | None = None
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float) -> Watch:
        w = Watch(deadline)
        with self._cond:
            self._active.add(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mergepipe-watchdog",
                                                daemon=True)
                self._thread.start()
            if self._next is None or deadline < self._next:
                self._cond.notify()
        return w

    def unwatch(self, w: Watch) -> None:
        w.close()
        with self._cond:
            self._active.discard(w)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                expired = [w for w in self._active if w.deadline <= now]
                for w in expired:
                    self._active.discard(w)
                    w.fire()
                self._next = min((w.deadline for w in self._active), default=None)
                self._cond.wait(None if self._next is None else self._next - now)


WATCHDOG = Watchdog()
CURRENT = threading.local()  # .watch: the Watch of the request this thread is making


@contextlib.contextmanager
def watching(conn: Any, deadline: float | None) -> Iterator[Watch | None]:
    """Cut `conn` off at `deadline` while the body runs (None: no deadline, nothing watched).
    The caller must hold the connection throughout (a response it is reading)."""
    if deadline is None or conn is None:
        yield None
        return
    w = WATCHDOG.watch(deadline)
    w.attach(conn)
    try:
        yield w
    finally:
        WATCHDOG.unwatch(w)


class _Watched:
    """Mixin of the connection classes: attach to the current thread's watch on connect and
    on every request (a kept-alive connection is reused by later requests)."""

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
