"""A warm benchmark worker: imports one tool once, then runs merge jobs sent as JSON lines.

`python -m benchmarks.worker ours|mergekit` reads one JSON job per stdin line and answers each
with a result line; imports are paid once and reported apart. Each job's peak RSS is the
process's VmHWM, reset before the job (/proc/self/clear_refs). `WorkerClient` is the harness side.
"""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any

from mergepipe_bench.proc import RESULT_PREFIX, child_env, emit, python_cmd

TOOLS = {"ours": "mergepipe_bench.ours_run", "mergekit": "mergepipe_bench.mergekit_run"}


class WorkerError(RuntimeError):
    """A job failed in the worker, or the worker died."""


class WorkerClient:
    """The harness side: start a worker, send jobs, read results, reap it (peak RSS)."""

    def __init__(self, tool: str, log: Path) -> None:
        self.tool = tool
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_path = log
        self._log: IO[str] = open(log, "a")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(python_cmd("mergepipe_bench.worker", tool), env=child_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, bufsize=1)
        ready = self._read()
        self.import_s = float(ready["import_s"])
        self.idle_rss = int(ready["idle_rss"])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT_PREFIX):
                result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
                if "error" in result:
                    raise WorkerError(f"{self.tool} worker: {result['error']}\n"
                                      f"{result.get('traceback', '')}")
                return result
        raise WorkerError(f"{self.tool} worker died; see {self._log_path}:\n{self._tail()}")

    def _tail(self) -> str:
        self._log.flush()
        return "\n".join(self._log_path.read_text().splitlines()[-15:])

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send one job and wait for its result; adds `wall_s` measured here."""
        assert self.proc.stdin is not None
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        result = self._read()
        result["wall_s"] = time.perf_counter() - t0
        return result

    def close(self) -> None:
        """Stop the worker and reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.returncode is None:
            self.close()


def _status_kib(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so each job's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main() -> None:
    """Worker side: import the tool, then serve jobs until stdin closes."""
    tool = sys.argv[1]
    t0 = time.perf_counter()
    module = importlib.import_module(TOOLS[tool])
    module.warm_up()
    emit({"ready": True, "import_s": time.perf_counter() - t0,
          "idle_rss": _status_kib("VmRSS") * 1024})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            gc.collect()
            start_rss = _status_kib("VmRSS") * 1024
            if job.pop("reset_peak", True):
                reset_peak_rss()
            result = module.run_job(job)
            emit({**result, "peak_rss": _status_kib("VmHWM") * 1024, "start_rss": start_rss})
        except Exception as e:  # report it; the harness decides
            emit({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})


if __name__ == "__main__":
    main()
