"""The server's side of the CLI beside it (cli/beside.py): `POST /v1/cli` runs one catalog
command in this process, on the server's open catalog, and streams what it prints back.

Only the user who started the server can use it: the request must carry the secret of the
advertisement file (mode 0600) and come from a loopback address; the command must be one that
takes part (`beside_server`). It runs with the caller's MERGEPIPE_* settings and working
directory, as a direct run would, so the caller's paths are not confined to the server's data
roots: whoever can read the advertisement can open the catalog file itself when no server runs.

The response is JSON lines: {"out": text} and {"err": text} as the command prints, then
{"rc": exit status}. The route is an ASGI wrapper outside the service's own middleware (its
token and Host checks are for API clients; this one has its own); it also writes the
advertisement once the application's start-up (the catalog opened) is complete, and removes it
when shutdown begins."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import io
import json
import logging
import os
import secrets
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mergepipe.cli.beside import (
    ENV_PREFIX,
    RELAY_PATH,
    SECRET_HEADER,
    Advert,
    absolute_paths,
    advert_path,
    remove_advert,
    write_advert,
)
from mergepipe.core.settings import Settings

log = logging.getLogger("mergepipe.service")

MAX_REQUEST_BYTES = 1 << 20
LOOPBACK_PEERS = ("127.0.0.1", "::1")
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class _Capture:
    """Where one relayed command's prints go: chunks handed to the event loop as they come."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.chunks: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.ready = asyncio.Event()

    def write(self, kind: str, text: str) -> None:
        with self.lock:
            self.chunks.append((kind, text))
        self.loop.call_soon_threadsafe(self.ready.set)

    def take(self) -> list[tuple[str, str]]:
        with self.lock:
            out, self.chunks = self.chunks, []
        return out


_local = threading.local()


class _Routed(io.TextIOBase):
    """sys.stdout / sys.stderr of a server: the real stream, except in a thread that runs a
    relayed command, whose prints go to its caller."""

    def __init__(self, real: TextIO, kind: str) -> None:
        self.real, self.kind = real, kind

    def _capture(self) -> _Capture | None:
        return getattr(_local, "capture", None)

    def write(self, text: str) -> int:
        cap = self._capture()
        if cap is None:
            return self.real.write(text)
        cap.write(self.kind, text)
        return len(text)

    def flush(self) -> None:
        if self._capture() is None:
            self.real.flush()

    def isatty(self) -> bool:
        return False if self._capture() is not None else self.real.isatty()

    def fileno(self) -> int:
        if self._capture() is not None:
            raise io.UnsupportedOperation("a relayed command's output is not a file")
        return self.real.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.real.encoding or "utf-8"


def install_streams() -> None:
    """Route sys.stdout and sys.stderr by thread (once; after logging is configured, so that
    log handlers keep the real streams)."""
    if not isinstance(sys.stdout, _Routed):
        sys.stdout = _Routed(sys.stdout, "out")
    if not isinstance(sys.stderr, _Routed):
        sys.stderr = _Routed(sys.stderr, "err")


def run_relayed(app: Any, doc: dict[str, Any], capture: _Capture) -> int:
    """Parse and run one command as `mergepipe` would, its prints to `capture`."""
    from mergepipe.cli.main import build_parser, run_command

    _local.capture = capture
    try:
        argv = doc.get("argv")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            print("mergepipe: error: the relay needs a list of arguments", file=sys.stderr)
            return 2
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # argparse printed its usage error (or --help)
            return int(e.code or 0)
        if not getattr(args, "beside_server", False):
            print(f"mergepipe {args.command}: error: this command does not run through a "
                  "server; stop the server to run it on its catalog", file=sys.stderr)
            return 2
        state = app.state.mergepipe
        env = {k: str(v) for k, v in dict(doc.get("env") or {}).items()
               if str(k).startswith(ENV_PREFIX)}
        cwd = str(doc.get("cwd") or "/")
        try:
            settings = Settings.from_env(env, catalog=str(state.settings.catalog))
            # (the caller's relative output root means its own directory, as run directly)
            args.settings = dataclasses.replace(
                settings, output_root=Path(cwd) / settings.output_root)
        except Exception as e:  # noqa: BLE001 - the caller's settings: its error, one line
            print(f"mergepipe {args.command}: error: {e}", file=sys.stderr)
            return 2
        args.server_catalog = state.cat
        args.cwd = cwd
        absolute_paths(args, cwd)
        try:
            return run_command(args)
        except Exception:  # a bug: the caller sees what a direct run would have shown
            log.exception("relayed command %s failed", args.command)
            traceback.print_exc(file=sys.stderr)
            return 1
    finally:
        _local.capture = None


class CliRelay:
    """ASGI wrapper: `POST /v1/cli`, and the advertisement around the application's life."""

    def __init__(self, app: Any, *, catalog: Path, host: str, port: int) -> None:
        self.app: ASGIApp = app
        self.inner = app
        self.advert = Advert(os.getpid(), WILDCARD_HOSTS.get(host, host), port,
                             secrets.token_urlsafe(32), str(catalog), advert_path(catalog))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), self._lifespan_send(send))
        elif scope["type"] == "http" and scope.get("path") == RELAY_PATH:
            await self._relay(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                install_streams()
                try:
                    write_advert(self.advert)
                except OSError as e:
                    log.warning("cannot advertise the server next to the catalog (%s): the "
                                "CLI cannot run beside it", e)
            await send(message)
        return wrapped

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                self.withdraw()
            return message
        return wrapped

    def withdraw(self) -> None:
        """Remove the advertisement (shutdown begins; also at exit)."""
        with contextlib.suppress(OSError):
            remove_advert(self.advert)

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        doc = await self._admit(scope, receive, send)
        if doc is None:
            return
        capture = _Capture(asyncio.get_running_loop())
        work = asyncio.get_running_loop().run_in_executor(
            None, run_relayed, self.inner, doc, capture)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        await _stream(capture, work, send)
        await send({"type": "http.response.body",
                    "body": (json.dumps({"rc": work.result()}) + "\n").encode(),
                    "more_body": False})

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> dict[str, Any] | None:
        """The request's JSON object, once its sender, size and shape are checked; None when
        it was refused (the refusal sent)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers") or []}
        peer = (scope.get("client") or ("", 0))[0]
        given = headers.get(SECRET_HEADER, "")
        local = peer in LOOPBACK_PEERS or peer == self.advert.host  # (our own address)
        if scope.get("method") != "POST" or not local or not hmac.compare_digest(
                given.encode(), self.advert.secret.encode()):
            await _refuse(send, 403, "forbidden", "the CLI relay takes POSTs with the "
                          "advertised secret, from this machine only")
            return None
        body = await _body(receive)
        if body is None:
            await _refuse(send, 413, "payload_too_large", "relay request too large")
            return None
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            await _refuse(send, 400, "bad_request", "relay request is not a JSON object")
            return None
        if not hasattr(self.inner.state, "mergepipe"):
            await _refuse(send, 503, "starting", "the server is not started yet")
            return None
        return doc


async def _body(receive: Receive) -> bytes | None:
    """The request body; None past MAX_REQUEST_BYTES."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if len(body) > MAX_REQUEST_BYTES:
            return None
        if msg["type"] != "http.request" or not msg.get("more_body"):
            return body


async def _stream(capture: _Capture, work: asyncio.Future[int], send: Send) -> None:
    """Send what the command prints, as JSON lines, until it ends."""
    while True:
        done = work.done()
        lines = [json.dumps({kind: text}) + "\n" for kind, text in _merge(capture.take())]
        if lines:
            await send({"type": "http.response.body", "body": "".join(lines).encode(),
                        "more_body": True})
        if done:
            return
        capture.ready.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(capture.ready.wait(), 0.2)


def _merge(chunks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive chunks of one stream as one."""
    out: list[tuple[str, str]] = []
    for kind, text in chunks:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    """A JSON error response (the service's error shape)."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(
        {"error": {"code": code, "message": message}}).encode()})
