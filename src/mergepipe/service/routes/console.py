"""The web console: its page at / and its static files (package data) at /console/."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

router = APIRouter(tags=["console"], include_in_schema=False)

ASSETS = "console"  # service/console/: index.html, console.css, *.js
# Everything comes from this server: no CDN, fonts, inline script or style attributes.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


@router.get("/", response_class=HTMLResponse)
def index() -> HTMLResponse:
    page = files("mergepipe.service").joinpath(ASSETS, "index.html").read_text("utf-8")
    return HTMLResponse(page, headers=HEADERS)


class Assets(StaticFiles):
    """StaticFiles with the console's headers (revalidated on each load: no stale scripts)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def install(app: FastAPI) -> None:
    """Mount the page and its assets (the API stays under /v1)."""
    app.include_router(router)
    app.mount("/console", Assets(packages=[("mergepipe.service", ASSETS)]), name="console")
