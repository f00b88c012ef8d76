"""A catalog outage as job threads live through it: they back off (exponentially, capped)
instead of polling a database that is down, and the process logs one line when the outage
begins and one when it ends, not a traceback per poll."""

from __future__ import annotations

import logging
import threading
import time

from mergepipe.catalog.connection import CatalogUnavailable

log = logging.getLogger("mergepipe.jobs")

FIRST_WAIT_S = 0.5
MAX_WAIT_S = 10.0


class Outage:
    """Shared by the threads of one process: whether the catalog is down, since when."""

    def __init__(self, first_s: float = FIRST_WAIT_S, cap_s: float = MAX_WAIT_S) -> None:
        self.first_s, self.cap_s = first_s, cap_s
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    def failed(self, e: CatalogUnavailable) -> float:
        """Record a failed use of the catalog; how long the thread should wait."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()
                log.warning("catalog unreachable, job threads back off (up to %.0fs between "
                            "tries): %s", self.cap_s, e.message)
            self._failures += 1
            return min(self.cap_s, self.first_s * 2 ** min(self._failures - 1, 30))

    def succeeded(self) -> None:
        """The catalog answered: the outage, if any, is over."""
        if self._since is None:
            return
        with self._lock:
            if self._since is not None:
                log.warning("catalog reachable again after %.1fs", time.monotonic() - self._since)
                self._since, self._failures = None, 0

    @property
    def down(self) -> bool:
        return self._since is not None
