"""/docs works without internet: Swagger UI's files come from the fastapi-offline package and
are served by the app itself under the console's CSP (in process); and Debian's chromium,
headless, with every request to another origin aborted, renders the operations list of a real
`mergepipe serve` on loopback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mergepipe.core.settings import Settings
from mergepipe.service.app import create_app
from mergepipe.service.routes.console import CSP
from tests.catalogs import new_catalog
from tests.live_server import Api
from tests.loopback_server import offline_browser, serving

METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


class _Refs(HTMLParser):
    """Every URL a page loads: script src, link href, img src; and inline scripts / styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline: list[str] = []
        self._tag: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key) and tag in ("script", "link", "img"):
                self.urls.append(str(a[key]))
        if "style" in a:
            self.inline.append(f"style attribute on <{tag}>")
        self._tag = tag

    def handle_data(self, data: str) -> None:
        if self._tag in ("script", "style") and data.strip():
            self.inline.append(f"inline <{self._tag}>")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    s = Settings.from_env({"MERGEPIPE_CATALOG": str(new_catalog(tmp_path)),
                           "MERGEPIPE_OUTPUT_ROOT": str(tmp_path / "out")})
    with TestClient(create_app(s), base_url="http://localhost") as c:
        yield c


def test_docs_page_and_everything_it_loads_come_from_the_app(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-security-policy"] == CSP
    refs = _Refs()
    refs.feed(r.text)
    assert not refs.inline, refs.inline  # the CSP allows no inline script or style
    assert len(refs.urls) >= 3 and all(u.startswith("/") and not u.startswith("//")
                                       for u in refs.urls), refs.urls
    for url in refs.urls:
        got = client.get(url)
        assert got.status_code == 200, url
        assert got.headers["content-security-policy"] == CSP, url
        assert got.headers["x-content-type-options"] == "nosniff", url
        if url.endswith(".css"):  # a stylesheet that pulls fonts or images from elsewhere
            assert not re.search(r"url\(\s*['\"]?(https?:)?//", got.text), url
            assert "@import" not in got.text, url
    bundle = next(u for u in refs.urls if u.endswith("swagger-ui-bundle.js"))
    assert len(client.get(bundle).content) > 500_000  # the real Swagger UI, not a stand-in
    assert client.get("/redoc").status_code == 404  # ReDoc came from a CDN too: not served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with serving(tmp_path_factory.mktemp("docs-server")) as api:
        yield api


def test_swagger_ui_renders_the_operations_with_no_network(
        server: Api, tmp_path: Path) -> None:
    spec = server.call("GET", "/openapi.json")[1]
    operations = sum(1 for item in spec["paths"].values() for m in item if m in METHODS)
    assert operations >= 10
    with offline_browser(tmp_path / "profile", server.base) as (ctx, blocked, errors):
        page = ctx.new_page()
        page.goto(server.base + "/docs")
        page.wait_for_function(f"() => document.querySelectorAll('.opblock').length >= {operations}")
        assert page.locator(".opblock").count() == operations
        assert "MergePipe" in page.locator(".info .title").inner_text()
        page.locator(".opblock-summary").first.click()  # an operation opens: the UI is live
        page.wait_for_selector(".opblock.is-open")
        page.screenshot(path=str(tmp_path / "docs.png"))
    assert not blocked, f"/docs reached out of the server: {blocked}"
    assert not errors, errors  # CSP violations are console errors
