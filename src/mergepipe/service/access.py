"""ASGI middleware run before any body is read: the Host allow-list, then the bearer tokens
(docs/api.md; invalid JSON without a token is 401, not 400), then the body size limit (413)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mergepipe.core.errors import InvalidRequest, Unauthorized
from mergepipe.core.settings import Settings
from mergepipe.service.errors import PayloadTooLarge, to_response

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
READ_ONLY_POSTS = {"/v1/sql", "/v1/plans"}
OPEN_PATHS = ("/healthz",)  # never need the read token (liveness probes)
CONFIG_POSTS = {"/v1/plans"}  # read-only POSTs whose body may need the write token


class BadHost(InvalidRequest):
    status = 400
    code = "bad_request"


def host_name(header: str) -> str:
    """'Example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def bearer_matches(header: str, *tokens: str | None) -> bool:
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    ok = False
    for t in tokens:
        if t:
            ok |= hmac.compare_digest(given.strip().encode(), t.encode())
    return ok


def _is_static(path: str) -> bool:
    return path in ("/", "/favicon.ico") or path.startswith("/console/")


class AccessGuard:
    """Refuses, before the route runs, requests for an unknown Host or without their token."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def check(self, scope: Scope) -> None:
        s = self.settings
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or []}
        host = headers.get("host")
        if host is not None and "*" not in s.allowed_hosts \
                and host_name(host) not in s.allowed_hosts:
            raise BadHost(f"host {host[:100]!r} is not served here (MERGEPIPE_ALLOWED_HOSTS)",
                          field="host")
        method, path = scope.get("method", "GET"), scope.get("path", "")
        auth = headers.get("authorization", "")
        if method in MUTATING and path not in READ_ONLY_POSTS:
            if s.api_token and not bearer_matches(auth, s.api_token):
                raise Unauthorized("missing or invalid bearer token (Authorization: Bearer "
                                   "<token>)")
        elif s.read_token and path not in OPEN_PATHS and not _is_static(path) \
                and not bearer_matches(auth, s.read_token, s.api_token):
            raise Unauthorized("this server needs a read token (Authorization: Bearer <token>)")

    def _needs_body_check(self, scope: Scope) -> bool:
        if scope.get("method") != "POST" or scope.get("path") not in CONFIG_POSTS \
                or not self.settings.api_token:
            return False
        auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        return not bearer_matches(auth, self.settings.api_token)

    async def _read_some(self, receive: Receive) -> tuple[list[Message], bytes, bool]:
        """The body's first messages, up to the body limit: (messages, bytes, complete)."""
        msgs: list[Message] = []
        body = b""
        while len(body) <= self.settings.max_body_bytes:
            msg = await receive()
            msgs.append(msg)
            if msg["type"] != "http.request":
                return msgs, body, False
            body += msg.get("body", b"")
            if not msg.get("more_body", False):
                return msgs, body, True
        return msgs, body, False

    async def _check_body(self, scope: Scope, receive: Receive) -> Receive:
        """Without the write token: refuse a plan body that is not JSON or has a config; the
        messages read are replayed to the app."""
        msgs, body, complete = await self._read_some(receive)
        if complete:
            try:
                doc: Any = json.loads(body)
            except ValueError:
                doc = None
            if not isinstance(doc, dict) or doc.get("config_yaml") is not None:
                raise Unauthorized("missing or invalid bearer token (Authorization: Bearer "
                                   "<token>): needed for a plan with a config, and to be told "
                                   "what is wrong with a body")

        async def replay() -> Message:
            return msgs.pop(0) if msgs else await receive()

        return replay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                self.check(scope)
                if self._needs_body_check(scope):
                    receive = await self._check_body(scope, receive)
            except (Unauthorized, BadHost) as e:
                await to_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
