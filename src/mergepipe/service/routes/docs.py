"""The API's interactive docs at /docs: Swagger UI from the files the fastapi-offline package
ships (served at /docs/assets/), started by a script of ours, under the console's CSP: nothing
is loaded from another site, so the page works without internet."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse

from mergepipe.service.routes.console import ASSETS, HEADERS, Assets

router = APIRouter(tags=["docs"], include_in_schema=False)

PAGE = "api-docs.html"  # service/console/api-docs.html; its script is console/api-docs.js
SWAGGER_PACKAGE = ("fastapi_offline", "static")  # swagger-ui-bundle.js, swagger-ui.css


@router.get("/docs", response_class=HTMLResponse)
def docs() -> HTMLResponse:
    page = files("mergepipe.service").joinpath(ASSETS, PAGE).read_text("utf-8")
    return HTMLResponse(page, headers=HEADERS)


def install(app: FastAPI) -> None:
    """Mount the page and Swagger UI's files (the app is made with docs_url=None)."""
    app.include_router(router)
    app.mount("/docs/assets", Assets(packages=[SWAGGER_PACKAGE]), name="docs-assets")
