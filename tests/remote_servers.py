"""Real servers on loopback for the remote-storage tests: moto's S3 server (a subprocess), a
static file server with Range / ETag / If-Match / bearer-token support, and a proxy in front of
either that counts the response-body bytes it sends and injects faults (503 bursts, connections
reset mid-body, truncated bodies)."""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ERROR_CODES = {503: "SlowDown", 500: "InternalError", 403: "AccessDenied", 404: "NoSuchKey"}


def s3_error(status: int) -> bytes:
    """An S3 error document for `status`."""
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{ERROR_CODES[status]}</Code>'
            f"<Message>injected by the test proxy</Message></Error>").encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3-compatible server in a subprocess on a free loopback port; its endpoint URL."""
    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- a static file server with Range support -----------------------------------------------------

def _etag(path: Path) -> str:
    st = path.stat()
    return '"' + hashlib.sha1(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest() + '"'


class _FileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root: Path
    token: str | None

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        if self.token is not None and self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._empty(401)
        rel = self.path.split("?", 1)[0].lstrip("/")
        path = (self.root / rel).resolve()
        if self.root not in path.parents or not path.is_file():
            return self._empty(404)
        tag = _etag(path)
        if self.headers.get("If-Match") not in (None, tag):
            return self._empty(412)
        data = path.read_bytes()
        status, start, end = 200, 0, len(data)
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
            if start >= len(data):
                return self._empty(416)
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", tag)
        self.send_header("Last-Modified", email.utils.formatdate(path.stat().st_mtime,
                                                                 usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start:end])

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def file_server(root: Path, token: str | None = None) -> Iterator[str]:
    """Serve `root` over HTTP on loopback (Range, ETag, If-Match; a bearer token if given)."""
    handler = type("Handler", (_FileHandler,), {"root": root.resolve(), "token": token})
    with _serving(ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
        yield url


@contextmanager
def _serving(server: ThreadingHTTPServer) -> Iterator[str]:
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- a counting, fault-injecting proxy -----------------------------------------------------------

@dataclass
class Fault:
    """What to do to the next `times` requests whose path contains `path_part` (by default
    ranged GETs only: block reads): answer `status` (503: a burst), reset the connection after
    `after` body bytes ("reset"), or close it cleanly after `after` bytes ("truncate"); a body
    is always cut before its end."""

    kind: str  # status | reset | truncate
    times: int = 1
    path_part: str = ""
    status: int = 503
    after: int = 0
    any_request: bool = False  # also HEAD, listings and whole-object GETs


@dataclass
class Counts:
    """What the proxy sent: response-body bytes and requests, per method and path."""

    body_bytes: dict[tuple[str, str], int] = field(default_factory=dict)
    requests: dict[tuple[str, str], int] = field(default_factory=dict)

    def get_bytes(self, path_part: str = "") -> int:
        return sum(n for (m, p), n in self.body_bytes.items() if m == "GET" and path_part in p)

    def get_requests(self, path_part: str = "") -> int:
        return sum(n for (m, p), n in self.requests.items() if m == "GET" and path_part in p)


class CountingProxy:
    """A reverse proxy on loopback in front of `upstream`; counts and injects faults."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.counts = Counts()
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str]] = []  # (method, path with query) in arrival order
        self.lock = threading.Lock()

    def inject(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def reset_counts(self) -> None:
        with self.lock:
            self.counts = Counts()

    def take_fault(self, method: str, path: str, ranged: bool) -> Fault | None:
        with self.lock:
            for f in self.faults:
                hit = f.any_request or (method == "GET" and ranged)
                if hit and f.path_part in path and f.times > 0:
                    f.times -= 1
                    return f
        return None

    def count(self, method: str, path: str, nbytes: int) -> None:
        key = (method, path.split("?", 1)[0])
        with self.lock:
            self.log.append((method, path))
            self.counts.body_bytes[key] = self.counts.body_bytes.get(key, 0) + nbytes
            self.counts.requests[key] = self.counts.requests.get(key, 0) + 1

    @contextmanager
    def serve(self) -> Iterator[str]:
        handler = type("Handler", (_ProxyHandler,), {"proxy": self})
        with _serving(ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
            yield url


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: CountingProxy

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _forward(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        fault = self.proxy.take_fault(self.command, self.path, "Range" in self.headers)
        if fault is not None and fault.kind == "status":
            doc = s3_error(fault.status) if self.command != "HEAD" else b""
            self.proxy.count(self.command, self.path, 0)  # an error document, not data
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)
            return
        conn = http.client.HTTPConnection(self.proxy.upstream, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            conn.request(self.command, self.path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            dropped = ("connection", "transfer-encoding") + (
                ("content-length",) if self.command != "HEAD" else ())
            out_headers = [(k, v) for k, v in r.getheaders() if k.lower() not in dropped]
        finally:
            conn.close()
        send = data if fault is None else data[:min(fault.after, len(data) - 1)]  # cut short
        self.proxy.count(self.command, self.path, len(send) if self.command != "HEAD" else 0)
        self.send_response(r.status)
        for k, v in out_headers:
            self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(send)
        if fault is not None:
            self.wfile.flush()
            self._drop(reset=fault.kind == "reset")

    def _drop(self, reset: bool) -> None:
        """Close mid-body: with a TCP reset, or a clean close that truncates the body."""
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()


def upload_dir(client: object, bucket: str, prefix: str, local: Path) -> None:
    """Put every file of `local` under s3://bucket/prefix/ (the test's own boto3 client)."""
    for f in sorted(local.iterdir()):
        if f.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{f.name}",  # type: ignore[attr-defined]
                              Body=f.read_bytes())


def environ_for(endpoint: str) -> dict[str, str]:
    """The AWS environment of a client of the loopback S3 server (plain HTTP allowed)."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true", "MERGEPIPE_REMOTE_BACKOFF_S": "0.01",
            "MERGEPIPE_REMOTE_ATTEMPTS": "4"}


