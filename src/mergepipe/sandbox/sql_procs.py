"""User SQL in worker processes (sql_worker.py): each slot of the sandbox is one process with
a data-size limit (RLIMIT_DATA), killed and replaced when a query outlives its time limit or
dies."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.sql_limits import SqlLimits
from mergepipe.sandbox.sql_exec import time_limit_error

# Past the time limit the worker has this long to answer (its own interrupt fires at the
# limit) before it is killed.
KILL_GRACE_S = 0.3
# Data (RLIMIT_DATA: heap and private writable mappings, which Linux counts since 4.7) of a
# worker besides the engine's memory limit: Python and DuckDB after a first query use about
# 100 MB. RLIMIT_AS would not do: DuckDB reserves about 700 MB of address space at
# connect (VmSize 110 MB -> 780 MB, VmData 26 MB -> 110 MB).
BASE_DATA = 256 << 20
DIED: dict[str, Any] = {}  # Worker.ask's answer when the worker ended before replying


def data_limit(limits: SqlLimits) -> int:
    """RLIMIT_DATA of a worker: the base, the engine's memory limit, and four copies of a
    result of `result_bytes` (rows, their JSON, the reply)."""
    return BASE_DATA + limits.memory_bytes + 4 * limits.result_bytes


# The only variables of the server's environment a worker gets (never its tokens or URLs).
WORKER_ENV = ("PATH", "PYTHONPATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in WORKER_ENV}
    return {**env, "OMP_NUM_THREADS": "1"}


def died_error(limits: SqlLimits, code: int | None) -> InvalidRequest:
    how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
    return InvalidRequest(
        f"query failed: its SQL worker process ended ({how}), most likely at its memory limit "
        f"({data_limit(limits) >> 20} MiB of data, {limits.memory_bytes >> 20} MiB for the "
        "engine)", field="sql")


class Worker:
    """One worker process and its pipes."""

    def __init__(self, limits: SqlLimits) -> None:
        self.limits = limits
        self.data = data_limit(limits)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mergepipe.sandbox.sql_worker", str(self.data)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            env=worker_env())
        self._buf = b""

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(2)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()  # type: ignore[union-attr]

    def ask(self, request: dict[str, Any], until: float) -> dict[str, Any] | None:
        """The worker's reply; None if it did not come by `until`; DIED if the worker ended."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return DIED
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = until - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return DIED
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply


class WorkerPool:
    """The slots' worker processes: up to `slots` of them, all started at the first query
    (each takes a second or so to import DuckDB), one replaced as soon as it is killed."""

    def __init__(self) -> None:
        self._idle: list[Worker] = []
        self.busy: set[Worker] = set()  # running a query now
        self._lock = threading.Lock()

    def _top_up(self, limits: SqlLimits) -> None:
        """Start idle workers until `limits.slots` exist (under the lock)."""
        for _ in range(limits.slots - len(self.busy) - len(self._idle)):
            self._idle.append(Worker(limits))

    def _take(self, limits: SqlLimits) -> Worker:
        want = data_limit(limits)
        with self._lock:
            stale = [w for w in self._idle if w.data != want or w.proc.poll() is not None]
            self._idle = [w for w in self._idle if w not in stale]
            w = self._idle.pop() if self._idle else Worker(limits)
            self.busy.add(w)
            self._top_up(limits)
        for old in stale:
            old.kill()
        return w

    def _give_back(self, w: Worker, keep: bool, limits: SqlLimits) -> None:
        """Back to the idle list, or killed and replaced up to this query's slots (not the
        slots of the query the worker was started for)."""
        if not keep:
            w.kill()
        with self._lock:
            self.busy.discard(w)
            if keep:
                self._idle.append(w)
            else:
                self._top_up(limits)

    def run(self, db: str, version: int, sql: str, limits: SqlLimits, deadline: float
            ) -> dict[str, Any]:
        """{columns, rows, truncated} from a worker; the time-limit error once the worker is
        killed past deadline + KILL_GRACE_S; a clear error if it died."""
        w = self._take(limits)
        request = {"db": db, "version": version, "sql": sql, "limits": dataclasses.asdict(limits),
                   "time_s": max(0.0, deadline - time.monotonic())}
        try:
            reply = w.ask(request, deadline + KILL_GRACE_S)
        except BaseException:
            self._give_back(w, False, limits)
            raise
        if reply is DIED:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(2)  # its pipe closed as it ended: its status comes just after
            self._give_back(w, False, limits)
            raise died_error(limits, w.proc.returncode)
        if reply is None:  # alive past its time: killed now
            self._give_back(w, False, limits)
            raise time_limit_error(limits)
        error = reply.get("error")
        self._give_back(w, not (error and error.get("fatal")), limits)
        if error:
            raise InvalidRequest(str(error.get("message")), field=error.get("field") or "sql")
        result: dict[str, Any] = reply["ok"]
        return result

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


POOL = WorkerPool()
