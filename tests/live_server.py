"""A real `mergepipe serve` of this tree on a loopback port, and a minimal JSON client for it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mergepipe_command() -> list[str]:
    """The installed `mergepipe` entry point (as in the container), else `python -m mergepipe`."""
    script = Path(sys.executable).parent / "mergepipe"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mergepipe"]


class Api:
    """A minimal JSON client (standard library), as a user's script would be."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        code, obj = self.call(method, path, body)
        assert code == status, (method, path, code, obj)
        return obj

    def wait(self, path: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            obj = self.ok("GET", path)
            if obj["status"] in ("ready", "succeeded", "failed"):
                return dict(obj)
            assert time.monotonic() < deadline, f"{path} still {obj['status']}"
            time.sleep(0.1)


def start_server(cwd: Path, settings: Mapping[str, str], *, token: str | None = None,
                 port: int | None = None, log: str = "server.log", up_s: float = 30
                 ) -> tuple[subprocess.Popen[bytes], Api]:
    """`mergepipe serve` in `cwd` on 127.0.0.1, its environment without the caller's
    MERGEPIPE_* variables but with `settings` (and `token` as MERGEPIPE_API_TOKEN), its output
    appended to cwd/`log`; returned once GET /healthz answers 200 (a failure after `up_s`)."""
    port = free_port() if port is None else port
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERGEPIPE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    env.update(settings, **({"MERGEPIPE_API_TOKEN": token} if token else {}))
    with (cwd / log).open("ab") as out:
        proc = subprocess.Popen([*mergepipe_command(), "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning"], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    api = Api(port, token)
    deadline = time.monotonic() + up_s
    while True:
        assert proc.poll() is None, (cwd / log).read_text()
        try:
            if api.call("GET", "/healthz")[0] == 200:
                return proc, api
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"server not up in {up_s:g} s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], *, graceful: bool = False) -> None:
    """SIGKILL (or SIGTERM, `graceful`) the server if it still runs, and wait for it."""
    if proc.poll() is None:
        if graceful:
            proc.terminate()
            proc.wait(30)
        else:
            proc.kill()
            proc.wait(10)


@contextmanager
def serving(cwd: Path, settings: Mapping[str, str], *, graceful: bool = False, **kw: Any
            ) -> Iterator[tuple[subprocess.Popen[bytes], Api]]:
    """start_server(...), stopped when the block ends."""
    proc, api = start_server(cwd, settings, **kw)
    try:
        yield proc, api
    finally:
        stop(proc, graceful=graceful)
