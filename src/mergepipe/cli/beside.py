"""The CLI beside a running server: catalog commands run in the `serve` holding the DuckDB file."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import io
import itertools
import json
import logging
import os
import secrets
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from mergepipe.core.errors import MergePipeError
from mergepipe.core.settings import Settings

if TYPE_CHECKING:
    import argparse

    from starlette.types import Message, Receive, Scope, Send

    from mergepipe.api import Catalog
    from mergepipe.catalog.db import Catalog as CatalogDatabase

ADVERT_SUFFIX = ".server.json"
RELAY_PATH = "/v1/cli"
SECRET_HEADER = "x-mergepipe-relay-secret"
ENV_PREFIX = "MERGEPIPE_"
MAX_REQUEST_BYTES = 1 << 20
LOOPBACK_PEERS = ("127.0.0.1", "::1")
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
log = logging.getLogger("mergepipe.service")
# What a server runs a relayed command with: cli.main's build_parser and run_command.
Cli = tuple[Callable[[], "argparse.ArgumentParser"], Callable[["argparse.Namespace"], int]]


class RelayFailed(MergePipeError):
    """The server beside which the command ran broke the relay off (it stopped mid-way)."""

    status = 502
    code = "relay_failed"


@dataclass(frozen=True)
class Advert:
    """What a running server says about itself next to its catalog."""

    pid: int
    host: str
    port: int
    secret: str
    catalog: str
    path: Path  # the advertisement file

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "host": self.host, "port": self.port,
                           "secret": self.secret, "catalog": self.catalog})


def advert_path(catalog: Path) -> Path:
    """CATALOG.server.json, next to the (absolute) catalog file."""
    c = catalog.expanduser().absolute()
    return c.with_name(c.name + ADVERT_SUFFIX)


def write_advert(advert: Advert) -> None:
    """Write the file atomically, readable and writable by this user only."""
    tmp = advert.path.with_name(f".{advert.path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(advert.to_json())
    os.replace(tmp, advert.path)


def remove_advert(advert: Advert) -> None:
    """Remove the file if it is still this server's."""
    current = read_advert(advert.path)
    if current is not None and current.pid == advert.pid and current.secret == advert.secret:
        with contextlib.suppress(FileNotFoundError):
            advert.path.unlink()


def read_advert(path: Path) -> Advert | None:
    """The advertisement in `path`, if there is one written by this user for this user only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None  # another user's, or readable by others: not trusted
        try:
            doc = json.loads(f.read(65536))
            return Advert(int(doc["pid"]), str(doc["host"]), int(doc["port"]),
                          str(doc["secret"]), str(doc["catalog"]), path)
        except (ValueError, KeyError, TypeError):
            return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_server(catalog: Path | str) -> Advert | None:
    """The live server advertised beside a DuckDB catalog (a stale advert is removed), or None."""
    if isinstance(catalog, str):
        return None  # a PostgreSQL URL: every process connects itself
    advert = read_advert(advert_path(catalog))
    if advert is None or advert.pid == os.getpid():
        return None
    if not alive(advert.pid):
        with contextlib.suppress(OSError):
            advert.path.unlink()
        return None
    return advert


def relay(advert: Advert, argv: list[str], command: str) -> int | None:
    """Run `argv` in the server, its output copied here; its exit status (None: nothing answers)."""
    import http.client

    body = json.dumps({"argv": argv, "cwd": os.getcwd(),
                       "env": {k: v for k, v in os.environ.items()
                               if k.startswith(ENV_PREFIX)}}).encode()
    conn = http.client.HTTPConnection(advert.host, advert.port, timeout=10)
    try:
        conn.request("POST", RELAY_PATH, body, {
            "Content-Type": "application/json", SECRET_HEADER: advert.secret,
            "Host": f"{'localhost' if ':' not in advert.host else '[::1]'}:{advert.port}"})
        if conn.sock is not None:
            conn.sock.settimeout(None)  # a merge runs as long as it runs
        resp = conn.getresponse()
    except (ConnectionRefusedError, TimeoutError, OSError):
        conn.close()
        return None
    try:
        if resp.status != 200:
            raise RelayFailed(f"the server (PID {advert.pid}) refused to run the command: "
                              f"{_error_message(resp.read())}")
        rc = None
        for line in resp:
            msg = json.loads(line)
            if "out" in msg:
                sys.stdout.write(msg["out"])
                sys.stdout.flush()
            elif "err" in msg:
                sys.stderr.write(msg["err"])
                sys.stderr.flush()
            elif "rc" in msg:
                rc = int(msg["rc"])
        if rc is None:
            raise RelayFailed(f"the server (PID {advert.pid}) stopped before `{command}` "
                              "finished; see its log")
        return rc
    except (OSError, http.client.HTTPException, ValueError):
        raise RelayFailed(f"the server (PID {advert.pid}) broke off `{command}`; see its "
                          "log") from None
    finally:
        conn.close()


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


# -- what a command uses ----------------------------------------------------------------------
@contextlib.contextmanager
def open_catalog(args: argparse.Namespace) -> Iterator[Catalog]:
    """The command's `mergepipe.Catalog`: over the server's database when relayed, else its own."""
    from mergepipe.api import Catalog  # start-up: imported only when it runs

    shared: CatalogDatabase | None = getattr(args, "server_catalog", None)
    with (Catalog(settings=args.settings) if shared is None
          else Catalog.over(shared, args.settings)) as cat:
        yield cat


def in_server(args: argparse.Namespace) -> bool:
    return getattr(args, "server_catalog", None) is not None


def absolute_paths(args: argparse.Namespace, cwd: str) -> None:
    """The command's local path options, made absolute against the caller's directory."""
    for dest in getattr(args, "local_paths", ()):
        value: Any = getattr(args, dest, None)
        if value is None or "://" in str(value):
            continue
        full = Path(cwd) / Path(str(value)).expanduser()
        setattr(args, dest, type(value)(full) if isinstance(value, Path) else str(full))


# -- the server's side: POST /v1/cli ----------------------------------------------------------
class _Capture:
    """Where one relayed command's prints go: chunks handed to the event loop as they come."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.chunks: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def write(self, kind: str, text: str) -> None:
        self.loop.call_soon_threadsafe(self.chunks.put_nowait, (kind, text))


_local = threading.local()


class _Routed(io.TextIOBase):
    """sys.stdout / sys.stderr of a server: a relayed command's thread prints to its caller."""

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
    """Route sys.stdout and sys.stderr by thread (after logging kept the real streams)."""
    if not isinstance(sys.stdout, _Routed):
        sys.stdout = _Routed(sys.stdout, "out")
    if not isinstance(sys.stderr, _Routed):
        sys.stderr = _Routed(sys.stderr, "err")


def run_relayed(app: Any, doc: dict[str, Any], capture: _Capture, cli: Cli) -> int:
    """Parse and run one command as `mergepipe` would, its prints to `capture`."""
    build_parser, run_command = cli
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

    def __init__(self, app: Any, cli: Cli, *, catalog: Path, host: str, port: int) -> None:
        self.app, self.cli = app, cli  # the FastAPI application
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
        with contextlib.suppress(OSError):
            remove_advert(self.advert)

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        doc = await self._admit(scope, receive, send)
        if doc is None:
            return
        capture = _Capture(asyncio.get_running_loop())
        work = asyncio.get_running_loop().run_in_executor(
            None, run_relayed, self.app, doc, capture, self.cli)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        await _stream(capture, work, send)
        await send({"type": "http.response.body",
                    "body": (json.dumps({"rc": work.result()}) + "\n").encode(),
                    "more_body": False})

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> dict[str, Any] | None:
        """The request's JSON object once its sender, size and shape pass; None when refused."""
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
        if not hasattr(self.app.state, "mergepipe"):
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
    """Send what the command prints until it ends: a JSON line per run of one stream's chunks
    (the thread's chunks are queued before its end is: none is left behind)."""
    queue = capture.chunks
    while not (work.done() and queue.empty()):
        chunks = []
        with contextlib.suppress(TimeoutError):
            chunks.append(await asyncio.wait_for(queue.get(), 0.2))
        while not queue.empty():
            chunks.append(queue.get_nowait())
        lines = [json.dumps({kind: "".join(text for _, text in run)}) + "\n"
                 for kind, run in itertools.groupby(chunks, key=lambda c: c[0])]
        if lines:
            await send({"type": "http.response.body", "body": "".join(lines).encode(),
                        "more_body": True})


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(
        {"error": {"code": code, "message": message}}).encode()})
