"""A real `mergepipe serve` of this tree on loopback, and Debian's chromium (headless, driven by
Playwright, a fresh profile) whose requests to any other origin are aborted and recorded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests import live_server
from tests.catalogs import new_catalog
from tests.live_server import Api

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags chromium calls out, and this network refuses it.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def serving(tmp: Path, token: str | None = None) -> Iterator[Api]:
    """The server on a fresh catalog, data root tmp/data, outputs under tmp/outputs."""
    (tmp / "data").mkdir(parents=True, exist_ok=True)
    with live_server.serving(tmp, {"MERGEPIPE_CATALOG": str(new_catalog(tmp)),
                                   "MERGEPIPE_OUTPUT_ROOT": str(tmp / "outputs"),
                                   "MERGEPIPE_DATA_ROOTS": str(tmp / "data")},
                             token=token, graceful=True) as (_, api):
        yield api


@contextmanager
def chromium(profile: Path, **options: Any) -> Iterator[Any]:
    """Debian's chromium with a fresh profile (never a browser of Playwright's own), headless;
    `options` for Playwright's launch_persistent_context."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (as .ci/run does)")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=FLAGS, **options)
        try:
            yield ctx
        finally:
            ctx.close()


@contextmanager
def offline_browser(profile: Path, origin: str) -> Iterator[tuple[Any, list[str], list[str]]]:
    """(context, blocked URLs, page errors): only `origin` (and data:/blob:) is reachable."""
    blocked: list[str] = []
    errors: list[str] = []

    def gate(route: Any) -> None:
        url = route.request.url
        if url.startswith(origin.rstrip("/") + "/") or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    with chromium(profile, viewport={"width": 1280, "height": 900}) as ctx:
        ctx.set_default_timeout(20_000)
        ctx.route("**/*", gate)
        ctx.on("page", lambda pg: (
            pg.on("pageerror", lambda e: errors.append(str(e))),
            pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)))
        yield ctx, blocked, errors
