"""The web console at / (static files at /console/) and the API's Swagger UI at /docs (its files
from the fastapi-offline package at /docs/assets/): nothing loaded from another site."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

router = APIRouter(tags=["console"], include_in_schema=False)

ASSETS = "console"  # service/console/: index.html, api-docs.html, console.css, *.js
SWAGGER_PACKAGE = ("fastapi_offline", "static")  # swagger-ui-bundle.js, swagger-ui.css
# Everything comes from this server: no CDN, fonts, inline script or style attributes.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def _page(name: str) -> HTMLResponse:
    page = files("mergepipe.service").joinpath(ASSETS, name).read_text("utf-8")
    return HTMLResponse(page, headers=HEADERS)


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    return _page("index.html")


@router.get("/docs", response_class=HTMLResponse)
def docs() -> HTMLResponse:
    return _page("api-docs.html")  # its script, console/api-docs.js, starts Swagger UI


class Assets(StaticFiles):
    """StaticFiles with the console's headers (revalidated on each load: no stale scripts)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def install(app: FastAPI) -> None:
    """Mount the pages and their assets (the API stays under /v1; the app has docs_url=None)."""
    app.include_router(router)
    app.mount("/console", Assets(packages=[("mergepipe.service", ASSETS)]), name="console")
    app.mount("/docs/assets", Assets(packages=[SWAGGER_PACKAGE]), name="docs-assets")
