"""Run a command as a child process and measure its wall time and peak RSS (its own VmHWM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "  # the line a worker prints its JSON result on


@dataclass
class Timed:
    """What one timed child run measured."""

    cmd: list[str]
    wall_s: float
    peak_rss: int  # bytes: the largest VmHWM of the child and its descendants
    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any] = field(default_factory=dict)  # the worker's BENCH-RESULT JSON

    def check(self) -> Timed:
        """Raise with the child's stderr tail when it failed."""
        if self.returncode != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"{' '.join(self.cmd[:5])} ... exited {self.returncode}:\n{tail}")
        return self


def run_timed(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
              timeout: float = 1800.0) -> Timed:
    """Start `cmd` (output to temp files), reap it with wait4: wall time, peak RSS, output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        timer = threading.Timer(timeout, os.kill, (proc.pid, signal.SIGKILL))
        timer.start()
        peak = PeakSampler(proc.pid)
        peak.start()
        try:
            _, status, _ = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            peak.stop()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode == -signal.SIGKILL and wall >= timeout:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... ran past {timeout:.0f} s")
    result: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    return Timed(cmd, wall, peak.kib * 1024, proc.returncode, stdout, stderr, result)


class PeakSampler(threading.Thread):
    """Peak RSS of a process tree: each process's own high-water mark (VmHWM), read every
    10 ms while it runs. Not wait4's ru_maxrss: Linux carries the exec-ing process's mark
    into it at exec, so a child of a large parent would report the parent's peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.kib = pid, 0
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        while not self._done.wait(0.01):
            try:
                pids = [self.pid, *(c.pid for c in psutil.Process(self.pid).children(True))]
            except psutil.Error:
                pids = [self.pid]
            self.kib = max([self.kib, *(_vm_hwm_kib(p) for p in pids)])

    def stop(self) -> None:
        self._done.set()
        self.join()


def _vm_hwm_kib(pid: int) -> int:
    """VmHWM of a live process in KiB (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def emit(result: dict[str, Any]) -> None:
    """Print a worker's result line (parsed by run_timed)."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, default=str) + "\n")
    sys.stdout.flush()


def python_cmd(module: str, *args: str) -> list[str]:
    """`python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of benchmark children: offline, no tokenizer threads."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env
