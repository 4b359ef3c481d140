"""The emulator's HTTP transport: a stdlib ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive.

Each request is read completely (Content-Length or chunked) and handed to
:meth:`~airflow_batch_emulator.server.BatchEmulator.dispatch`; answers go out with an
exact ``Content-Length``, large bodies in 1 MiB pieces. The server keeps its open connections so
that stopping the emulator can close them.
"""

from __future__ import annotations

import logging
import select
import socket
import sys
import threading
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from airflow_batch_emulator.wire import Response, request_id

log = logging.getLogger("airflow_batch_emulator")

PIECE = 1024 * 1024


class Dispatcher(Protocol):
    """What answers the requests (the emulator: typed here so that this module need not import it)."""

    def dispatch(self, handler: Handler) -> None:
        """Answer one request on ``handler``."""


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], emulator: Dispatcher) -> None:
        self.emulator = emulator
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore clients that hang up; log anything else once."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        log.exception("emulator connection error from %s", client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HttpServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: batch state changes are logged instead."""

    def _handle(self) -> None:
        try:
            self.server.emulator.dispatch(self)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

    def read_body(self, limit: int) -> bytearray | None:
        """Read the whole body (Content-Length or chunked); None when it exceeds ``limit``."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        length = int(self.headers.get("Content-Length") or 0)
        if length > limit:
            self._drain(length)
            return None
        buf = bytearray(length)
        view = memoryview(buf)
        got = 0
        while got < length:
            n = self.rfile.readinto(view[got:])
            if not n:
                raise ConnectionResetError("client closed the connection mid-body")
            got += n
        return buf

    def _read_chunked(self, limit: int) -> bytearray | None:
        buf = bytearray()
        too_big = False
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return None if too_big else buf
            chunk = self.rfile.read(size)
            self.rfile.readline(8)
            if len(buf) + len(chunk) > limit:
                too_big = True
                buf.clear()
            elif not too_big:
                buf += chunk

    def wait_or_hangup(self, seconds: float, release: threading.Event | None = None) -> bool:
        """Sleep up to ``seconds`` (less once ``release`` is set); return False as soon as the client hangs up."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (release is not None and release.is_set()):
                return True
            try:
                readable, _, _ = select.select([self.connection], [], [], min(left, 0.1))
                # Readable with nothing to read means the peer closed (or reset) the connection.
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    return False
            except (OSError, ValueError):
                return False

    def _drain(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(PIECE, length))
            if not chunk:
                return
            length -= len(chunk)

    def send(self, response: Response) -> None:
        """Write ``response`` with an exact Content-Length; big bodies go in pieces."""
        body = response.body
        try:
            phrase = HTTPStatus(response.status).phrase
        except ValueError:
            phrase = "Unknown"
        rid = request_id()
        lines = [
            f"HTTP/1.1 {response.status} {phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(body)}",
            f"x-request-id: {rid}",
            f"request-id: {rid}",
            f"Date: {formatdate(usegmt=True)}",  # as every origin server with a clock sends (RFC 9110 6.6.1)
        ]
        lines.extend(f"{key}: {value}" for key, value in response.headers.items())
        if response.close:
            self.close_connection = True
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if len(body) <= 4 * PIECE:
            self.wfile.write(head + body)
            return
        self.wfile.write(head)
        view = memoryview(body)
        for start in range(0, len(body), PIECE):
            self.wfile.write(view[start : start + PIECE])
