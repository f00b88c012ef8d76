"""A real `mergepipe serve` of this tree on loopback, and Debian's chromium (headless, driven by
Playwright, a fresh profile) whose requests to any other origin are aborted and recorded."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.catalogs import new_catalog
from tests.test_server_e2e import REPO, Api, free_port, mergepipe_command

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def serving(tmp: Path, token: str | None = None) -> Iterator[Api]:
    """The server on a fresh catalog, data root tmp/data, outputs under tmp/outputs."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERGEPIPE_")}
    env.update(MERGEPIPE_CATALOG=str(new_catalog(tmp)), MERGEPIPE_OUTPUT_ROOT=str(tmp / "outputs"),
               MERGEPIPE_DATA_ROOTS=str(tmp / "data"), PYTHONPATH=str(REPO / "src"))
    if token:
        env["MERGEPIPE_API_TOKEN"] = token
    (tmp / "data").mkdir(parents=True, exist_ok=True)
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen([*mergepipe_command(), "serve", "--host", "127.0.0.1", "--port",
                             str(port), "--log-level", "warning"], cwd=tmp, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    api = Api(port, token)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()
            try:
                if api.call("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server not up in 30 s"
            time.sleep(0.1)
        yield api
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@contextmanager
def offline_browser(profile: Path, origin: str) -> Iterator[tuple[Any, list[str], list[str]]]:
    """(context, blocked URLs, page errors): only `origin` (and data:/blob:) is reachable."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (as .ci/run does)")
    blocked: list[str] = []
    errors: list[str] = []

    def gate(route: Any) -> None:
        url = route.request.url
        if url.startswith(origin.rstrip("/") + "/") or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 900})
        try:
            ctx.set_default_timeout(20_000)
            ctx.route("**/*", gate)
            ctx.on("page", lambda pg: (
                pg.on("pageerror", lambda e: errors.append(str(e))),
                pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)))
            yield ctx, blocked, errors
        finally:
            ctx.close()
