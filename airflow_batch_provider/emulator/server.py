"""The HTTP server (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive) and the ``BatchEmulator`` facade.

Each request is read completely, checked for auth, rolled for HTTP faults, routed, and answered
with an exact ``Content-Length``; large bodies go out in 1 MiB pieces. ``/_emulator/*`` control
routes need no auth and are never faulted.

A route delay (``Faults.delay_routes`` / ``delay_after_routes``) holds the request in its handler
thread and watches the socket meanwhile: a client that hangs up (a killed process) ends the wait
at once, and a request delayed *before* its route is then dropped undone.
"""

from __future__ import annotations

import logging
import re
import select
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

import orjson

from airflow_batch_provider.emulator.anthropic_api import AnthropicApi
from airflow_batch_provider.emulator.anthropic_batch import AnthropicRunner
from airflow_batch_provider.emulator.bedrock_api import BedrockApi, bedrock_error, is_bedrock_path
from airflow_batch_provider.emulator.config import EmulatorConfig
from airflow_batch_provider.emulator.engine import Engine
from airflow_batch_provider.emulator.faults import Faults
from airflow_batch_provider.emulator.openai_api import OpenAIApi
from airflow_batch_provider.emulator.openai_batch import OpenAIRunner
from airflow_batch_provider.emulator.store import Store
from airflow_batch_provider.emulator.wire import (
    ApiError,
    ErrorFactory,
    Request,
    Response,
    anthropic_error,
    json_response,
    openai_error,
    request_id,
)

log = logging.getLogger("airflow_batch_provider.emulator")

PIECE = 1024 * 1024
_Route = tuple[str, "re.Pattern[str]", Any]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], emulator: BatchEmulator) -> None:
        self.emulator = emulator
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore clients that hang up; log anything else once."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        log.exception("emulator connection error from %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

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

    def wait_or_hangup(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return False as soon as the client closes its connection."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
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


class BatchEmulator:
    """A local OpenAI + Anthropic batch API server for tests and demos.

    ``start()`` binds (port 0 picks a free port) and serves from daemon threads; ``stop()`` shuts
    everything down. Use it as a context manager to do both. ``stats()``, ``reset()``,
    ``set_faults(**kwargs)`` and ``batches()`` act in-process, like the ``/_emulator`` routes.
    """

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        self.store = Store(self.config.faults)
        openai_runner = OpenAIRunner(self.store, self.config.latency, self.config.slice_size)
        anthropic_runner = AnthropicRunner(self.store, self.config.latency, self.config.slice_size)
        self.engine = Engine(self.store, openai_runner, anthropic_runner)
        self.bedrock = BedrockApi(self.store, self.config)  # owns its job worker and S3 endpoint
        self._routes: list[_Route] = []
        for method, pattern, handler in [
            *OpenAIApi(self.store, openai_runner, self.config).routes(),
            *AnthropicApi(self.store, anthropic_runner, self.config).routes(),
            *self.bedrock.routes(),
        ]:
            self._routes.append((method, re.compile(pattern), handler))
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle --------------------------------------------------------------------------------

    def start(self) -> BatchEmulator:
        """Bind and start serving in a daemon thread; return self."""
        if self._server is not None:
            return self
        self._server = _Server((self.config.host, self.config.port), self)
        self.engine.start()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="batch-emulator-http", daemon=True
        )
        self._thread.start()
        log.info("batch emulator listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving, close open connections and stop the worker."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            with server.connections_lock:
                connections = list(server.connections)
            for conn in connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.engine.stop()
        self.bedrock.close()

    def __enter__(self) -> BatchEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """The bound host."""
        return self.config.host

    @property
    def port(self) -> int:
        """The bound port (only meaningful once started)."""
        if self._server is None:
            raise RuntimeError("The emulator is not running; call start() first.")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (the Anthropic base URL)."""
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``http://HOST:PORT/v1`` (the OpenAI base URL)."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``http://HOST:PORT`` (no ``/v1``: the Anthropic SDK adds it)."""
        return self.url

    @property
    def s3_endpoint_url(self) -> str:
        """The S3 endpoint Bedrock jobs use (starts moto's server on first use when none was configured)."""
        return self.bedrock.s3.url

    # control ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Return the cumulative counters (see ``GET /_emulator/stats``)."""
        return self.store.stats()

    def reset(self) -> None:
        """Forget every file, batch and counter; faults go back to the start-up settings."""
        self.store.reset()
        self.bedrock.runner.reset()

    def set_faults(self, **settings: Any) -> Faults:
        """Replace the fault settings (fields not given go back to off) and return them."""
        faults = Faults.from_mapping(settings)
        self.store.set_faults(faults)
        return faults

    @property
    def faults(self) -> Faults:
        """The fault settings in force."""
        return self.store.faults

    def batches(self, include_custom_ids: bool = False) -> list[dict[str, Any]]:
        """List every batch of both providers with its status and custom_id count."""
        return self.store.batches(include_custom_ids) + self.bedrock.batches(include_custom_ids)

    # dispatch ---------------------------------------------------------------------------------

    def dispatch(self, handler: _Handler) -> None:
        """Answer one request on ``handler``."""
        path, _, qs = handler.path.partition("?")
        family: ErrorFactory = anthropic_error if path.startswith("/v1/messages") else openai_error
        family = bedrock_error if is_bedrock_path(path) else family
        try:
            body = handler.read_body(self.config.max_upload_bytes)
        except ValueError:
            handler.close_connection = True
            handler.send(family(400, "invalid_request_error", "Malformed Content-Length or chunked body.").response())
            return
        if body is None:
            handler.send(family(413, "request_too_large", "The request body is too large.").response())
            return
        host = handler.headers.get("Host") or f"{self.host}:{self.port}"
        req = Request(handler.command, path, dict(parse_qsl(qs)), handler.headers, body, f"http://{host}")
        if path.startswith("/_emulator/"):
            handler.send(self._control(req))
            return
        handler.send(self._api(req, handler, family))

    def _api(self, req: Request, handler: _Handler, family: ErrorFactory) -> Response:
        self.store.bump("http", "requests")
        auth = req.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        signed = auth.startswith("AWS4-HMAC-SHA256 ")  # boto3 signs with SigV4 (Bedrock routes)
        if not bearer and not signed and not req.headers.get("x-api-key", "").strip():
            return family(401, "authentication_error", "Missing or empty API key.").response()
        fault = self.store.dice.pick(self.store.faults)
        if fault == "drop":
            self.store.bump("http", "dropped")
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            raise ConnectionAbortedError("dropped on purpose")
        if fault == "429":
            self.store.bump("http", "injected_429")
            wait = self.store.faults.retry_after
            error = family(429, "rate_limit_error", "Rate limit reached (emulator fault http_429_rate).")
            error.headers = {"retry-after": f"{wait:g}", "retry-after-ms": str(int(wait * 1000))}
            return error.response()
        if fault == "500":
            self.store.bump("http", "injected_500")
            return family(500, "api_error", "Internal server error (emulator fault http_500_rate).").response()
        before, after = self.store.faults.route_delay(req.method, req.path)
        if before:
            self._delay(handler, req, before, "before")
        for method, pattern, route in self._routes:
            match = pattern.fullmatch(req.path)
            if match and method == req.method:
                req.params = match.groupdict()
                try:
                    response: Response = route(req)
                except ApiError as exc:
                    response = exc.response()
                except Exception:
                    log.exception("emulator error on %s %s", req.method, req.path)
                    response = family(500, "api_error", "The emulator failed on this request.").response()
                break
        else:
            response = family(404, "not_found_error", f"Invalid URL ({req.method} {req.path})").response()
        if after:
            self._delay(handler, req, after, "after")
        return response

    def _delay(self, handler: _Handler, req: Request, seconds: float, phase: str) -> None:
        """Hold one request ``seconds`` (fault ``delay_routes`` / ``delay_after_routes``).

        Raise ``ConnectionAbortedError`` when the client hangs up meanwhile, so nothing more is
        done for it: before the route that means the call never happened; after it, the work is
        done but the answer is lost.
        """
        what = f"{req.method} {req.path}"
        self.store.delay_enter(phase, what)
        log.info("delaying %s %s the route by %g s (fault)", what, phase, seconds)
        try:
            alive = handler.wait_or_hangup(seconds)
        finally:
            self.store.delay_exit(phase, what)
        if not alive:
            self.store.bump("http", "delayed_abandoned")
            log.info("client hung up while %s was delayed %s the route; nothing is answered", what, phase)
            handler.close_connection = True
            raise ConnectionAbortedError(f"client hung up during a {phase}-route delay")

    def _control(self, req: Request) -> Response:
        route = (req.method, req.path.rstrip("/"))
        if route == ("GET", "/_emulator/stats"):
            return json_response(self.stats())
        if route == ("GET", "/_emulator/health"):
            return json_response({"ok": True})
        if route == ("POST", "/_emulator/reset"):
            self.reset()
            return json_response({"ok": True})
        if route == ("GET", "/_emulator/faults"):
            return json_response(self.faults.to_dict())
        if route == ("POST", "/_emulator/faults"):
            try:
                settings = orjson.loads(req.body) if req.body else {}
                if not isinstance(settings, dict):
                    raise ValueError("expected a JSON object")
                return json_response(self.set_faults(**settings).to_dict())
            except (ValueError, TypeError) as exc:
                return json_response({"error": str(exc)}, 400)
        if route == ("GET", "/_emulator/batches"):
            include = req.query.get("custom_ids", "") in ("1", "true")
            return json_response({"data": self.batches(include)})
        return json_response({"error": f"unknown control route {req.method} {req.path}"}, 404)
