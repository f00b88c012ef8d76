"""The one exception handler: every failure becomes {"error": {"code", "message", "field"?}}."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mergepipe.catalog.db import outage
from mergepipe.core.errors import MergePipeError
from mergepipe.core.schema import error_message, field_name

log = logging.getLogger("mergepipe.service")

# Starlette's own HTTP errors (unknown route, wrong method, ...) keep their status.
_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
               413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_request",
               429: "too_many_requests"}


class PayloadTooLarge(MergePipeError):
    """The request body is larger than the configured limit."""

    status = 413
    code = "payload_too_large"


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        err["field"] = field
    return {"error": err}


def to_response(exc: Exception) -> JSONResponse:
    """The status and the error shape of any exception."""
    headers: dict[str, str] | None = None
    if isinstance(exc, StarletteHTTPException) and isinstance(exc.__cause__, MergePipeError):
        exc = exc.__cause__  # e.g. the body limit tripping while FastAPI reads the body
    down = outage(exc)  # the catalog's database unreachable, however it surfaced
    if down is not None:
        exc = down
    if isinstance(exc, MergePipeError):
        status, body = exc.status, {"error": exc.to_dict()}
        if status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        retry_after = getattr(exc, "retry_after_s", None)
        if status == 503 and retry_after is not None:
            headers = {"Retry-After": str(int(retry_after))}
            log.warning("%s: %s", exc.code, exc.message)
        elif status >= 500:
            log.error("internal error %s: %s", exc.code, exc.message)
    elif isinstance(exc, RequestValidationError):
        errors = list(exc.errors())
        first = errors[0] if errors else {}
        field = field_name(first.get("loc", ()))
        status, body = 422, error_body("invalid_request", error_message(first, field), field)
    elif isinstance(exc, StarletteHTTPException):
        status = exc.status_code
        body = error_body(_HTTP_CODES.get(status, "http_error"), str(exc.detail))
        headers = dict(exc.headers) if exc.headers else None
    else:
        log.exception("unhandled error", exc_info=exc)
        status, body = 500, error_body("internal_error",
                                       f"internal server error ({type(exc).__name__})")
    return JSONResponse(body, status_code=status, headers=headers)


async def handle(request: Request, exc: Exception) -> JSONResponse:
    return to_response(exc)


def install(app: FastAPI) -> None:
    """Route every exception class through `handle`."""
    for cls in (MergePipeError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(cls, handle)
