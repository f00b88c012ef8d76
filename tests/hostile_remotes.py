"""An attacker's HTTP servers on loopback, for the remote-confinement and deadline tests: one that
redirects (and decodes `%2F` in paths as some servers do), one that trickles its headers or its
body a byte at a time or says nothing at all, and one whose HEAD claims a huge size."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from tests.remote_servers import _FileHandler, _serving


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


@dataclass
class Redirector:
    """Serves the files under `root` by percent-decoded path (so `/allowed/..%2Fsecret/x` reads
    `/secret/x`), except the paths in `redirects`, answered `302 Location: <value>`. Every
    request is recorded with its Authorization header."""

    root: Path
    redirects: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]

    @contextmanager
    def serve(self, tls: ssl.SSLContext | None = None) -> Iterator[str]:
        owner = self

        class Handler(_FileHandler):
            root = self.root.resolve()
            token = None

            def _serve(self, body: bool) -> None:
                owner.seen.append(Seen(self.command, self.path,
                                       self.headers.get("Authorization")))
                target = owner.redirects.get(self.path)
                if target is not None:
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.path = unquote(self.path)  # a server that decodes %2F before resolving
                super()._serve(body)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        with _serving(server) as url:
            yield url.replace("http://", "https://") if tls is not None else url


def self_signed(tmp: Path) -> tuple[ssl.SSLContext, Path]:
    """A server context with a fresh self-signed certificate for 127.0.0.1, and the
    certificate's file (for SSL_CERT_FILE: the client then trusts it)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx, cert


class Trickler:
    """A raw-socket server that holds every request it gets: `mode` "headers" sends a status
    line, then header bytes one every `interval` seconds, forever; "body" answers HEAD honestly
    (Content-Length: the size of `data`) and a ranged GET with its headers, then the bytes of
    `data` one every `interval` seconds; "silent" reads the request and never answers. Counts
    connections, and those still open."""

    def __init__(self, mode: str, *, interval: float = 0.2, data: bytes = b"") -> None:
        self.mode, self.interval, self.data, self.size = mode, interval, data, len(data)
        self.connections = 0
        self._open = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []

    @contextmanager
    def serve(self) -> Iterator[str]:
        listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            self._stop.set()
            listener.close()
            with self._lock:
                for s in self._socks:
                    s.close()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._socks.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def _hold(self, conn: socket.socket) -> None:
        with self._lock:
            self._open += 1
        try:
            self._answer(conn)
        finally:
            with self._lock:
                self._open -= 1

    def _answer(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn)
            if request is None:
                return
            if self.mode == "silent":
                self._stop.wait()
                return
            if self.mode == "headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not self._stop.wait(self.interval):
                    conn.sendall(b"a")
                return
            if request.startswith(b"HEAD"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: \"t\"\r\n"
                             b"Last-Modified: Fri, 04 Dec 2026 12:00:00 GMT\r\n\r\n" % self.size)
                return self._answer(conn)
            start, end = _range(request, self.size)
            conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n"
                         b"Content-Range: bytes %d-%d/%d\r\n\r\n"
                         % (end - start + 1, start, end, self.size))
            for i in range(start, end + 1):
                if self._stop.wait(self.interval):
                    return
                conn.sendall(self.data[i:i + 1])
        except OSError:
            return


def _read_request(conn: socket.socket) -> bytes | None:
    """A request's head, read up to its blank line; None if the peer closed first."""
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        request += chunk
    return request


def _range(request: bytes, size: int) -> tuple[int, int]:
    """The first and last byte a request's Range header asks for (the whole file without one)."""
    start, end = 0, size - 1
    for line in request.decode("latin-1").split("\r\n"):
        if line.lower().startswith("range: bytes="):
            a, _, b = line.split("=", 1)[1].partition("-")
            start, end = int(a), int(b or size - 1)
    return start, end


def huge_header(shape: tuple[int, ...] = (1 << 20, 1 << 38)) -> tuple[bytes, int]:
    """The first bytes of a safetensors file whose one F32 tensor of `shape` exactly fills it,
    and the size that file would have (2^60 bytes of data: nothing real is that large)."""
    nbytes = 4
    for d in shape:
        nbytes *= d
    meta = json.dumps({"big.weight": {"dtype": "F32", "shape": list(shape),
                                      "data_offsets": [0, nbytes]}}).encode()
    meta += b" " * (-len(meta) % 8)
    head = struct.pack("<Q", len(meta)) + meta
    return head, len(head) + nbytes


class Liar:
    """Answers HEAD with the size of `huge_header`'s file, and ranged GETs inside its header
    with the header's bytes (zeros beyond): a checkpoint that exists only as a claim."""

    def __init__(self) -> None:
        self.head, self.size = huge_header()
        self.requests = 0

    @contextmanager
    def serve(self) -> Iterator[str]:
        owner = self

        class Handler(_FileHandler):
            def _serve(self, body: bool) -> None:
                owner.requests += 1
                rng = self.headers.get("Range", "bytes=0-").split("=", 1)[1]
                a, _, b = rng.partition("-")
                start = int(a)
                end = min(int(b) if b else owner.size - 1, start + (1 << 20) - 1)
                self.send_response(206 if body else 200)
                self.send_header("Content-Length", str(end - start + 1 if body else owner.size))
                self.send_header("ETag", '"lie"')
                if body:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{owner.size}")
                self.end_headers()
                if body:
                    data = owner.head[start:end + 1]
                    self.wfile.write(data + b"\0" * (end + 1 - start - len(data)))

        with _serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
            yield url


def wait_until(check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
