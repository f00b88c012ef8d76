"""ASGI middleware that refuses request bodies above the configured size with 413."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mergepipe.service.errors import PayloadTooLarge, to_response


class BodyLimit:
    """Checks Content-Length up front and counts streamed (chunked) bytes as they arrive."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = PayloadTooLarge(f"request body exceeds the {self.max_bytes} byte limit")
        if _declared_length(scope) > self.max_bytes:
            await to_response(too_big)(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise too_big
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLarge as e:
            if started:
                raise
            await to_response(e)(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length; -1 when absent or not a number."""
    length = dict(scope.get("headers") or []).get(b"content-length")
    try:
        return -1 if length is None else int(length)
    except ValueError:
        return -1
