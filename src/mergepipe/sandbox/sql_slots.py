"""A fixed number of user-SQL slots, each query in its own thread, a bounded wait for a slot."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from mergepipe.core.errors import Busy
from mergepipe.core.sql_limits import SqlLimits

# Scheduling priority (nice) of the threads that run user queries: under CPU contention the
# event loop and /healthz come first.
SLOT_NICE = 10
# How often a waiting request (on the event loop) looks for a free slot.
POLL_S = 0.05


class SqlSlots:
    """`n` user queries run at once, each in its own daemon thread (never a request thread);
    up to `queue` more wait for a slot until their deadline, and any beyond get Busy (429) at
    once. In the server a slot's thread drives a worker process (sql_procs.py), killed past
    the time limit; in-process, a query deaf to its interrupt keeps its slot until it ends."""

    def __init__(self, n: int, queue: int) -> None:
        self.n, self.queue = n, queue
        self._free = threading.BoundedSemaphore(n)
        self._lock = threading.RLock()  # _busy() also counts under it
        self.waiting = 0    # callers waiting for a slot now
        self.in_use = 0     # slots taken now
        self.refusals = 0   # callers sent away with Busy since the process started

    def _taken(self, n: int) -> None:
        with self._lock:
            self.in_use += n

    def _busy(self) -> Busy:
        with self._lock:
            self.refusals += 1
        return Busy(f"{self.n} SQL queries are running and {self.waiting} waiting; retry later",
                    field="sql")

    @contextlib.contextmanager
    def _in_queue(self) -> Any:
        with self._lock:
            if self.waiting >= self.queue:
                raise self._busy()
            self.waiting += 1
        try:
            yield
        finally:
            with self._lock:
                self.waiting -= 1

    def acquire(self, deadline: float) -> None:
        """Take a slot, waiting until `deadline` (time.monotonic) at most; else Busy."""
        if not self._free.acquire(blocking=False):
            with self._in_queue():
                if not self._free.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise self._busy()
        self._taken(1)

    async def acquire_async(self, deadline: float) -> None:
        """acquire() on the event loop: a waiting request holds no thread."""
        import asyncio  # the server's; the CLI's `sql` does not load it (0.05 s)

        if not self._free.acquire(blocking=False):
            with self._in_queue():
                while not self._free.acquire(blocking=False):
                    if time.monotonic() >= deadline:
                        raise self._busy()
                    await asyncio.sleep(POLL_S)
        self._taken(1)

    def start(self, work: Callable[[], dict[str, Any]]) -> Future[dict[str, Any]]:
        """Run `work` in a thread of its own on a slot taken with acquire(); frees it after."""
        fut: Future[dict[str, Any]] = Future()
        fut.set_running_or_notify_cancel()

        def run() -> None:
            with contextlib.suppress(OSError, AttributeError):  # behind request handling
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SLOT_NICE)
            result: dict[str, Any] | None = None
            error: BaseException | None = None
            try:
                result = work()
            except BaseException as e:  # noqa: BLE001 - handed over to the caller
                error = e
            finally:
                self._taken(-1)
                self._free.release()  # before the caller hears: its next query finds it free
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result or {})

        try:
            threading.Thread(target=run, name="mergepipe-sql", daemon=True).start()
        except BaseException:
            self._taken(-1)
            self._free.release()
            raise
        return fut


_slots: dict[tuple[int, int], SqlSlots] = {}
_slots_lock = threading.Lock()


def slots_for(limits: SqlLimits) -> SqlSlots:
    """The process's slots (one set per (slots, queue) setting; a server has one)."""
    with _slots_lock:
        key = (limits.slots, limits.queue)
        return _slots.setdefault(key, SqlSlots(*key))
