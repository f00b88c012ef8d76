"""Log lines that carry the request id of the work they describe, as text or as JSON."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

# The request id of the HTTP request being served, or of the request that queued the job a
# worker thread is running; None outside both.
REQUEST_ID: ContextVar[str | None] = ContextVar("mergepipe_request_id", default=None)
# What a client may send as X-Request-ID: printable, no spaces, at most 128 characters.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


@contextmanager
def request_context(request_id: str | None) -> Iterator[None]:
    """Log lines and job rows made inside carry `request_id`."""
    token = REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        REQUEST_ID.reset(token)


def request_id_from(header: str | None) -> str:
    """The client's X-Request-ID when it is well formed, else a new one."""
    if header is not None and _CLIENT_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


def install_record_factory() -> None:
    """Every log record made from now on carries `request_id` from the context ('-' outside a
    request or job), whatever handler writes it."""
    make = logging.getLogRecordFactory()
    if getattr(make, "carries_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.request_id = REQUEST_ID.get() or "-"
        return record

    factory.carries_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, exception."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage(),
               "request_id": getattr(record, "request_id", "-")}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """The root logger writes to stderr in `fmt` ('text' or 'json'), every line with its
    request id."""
    install_record_factory()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
