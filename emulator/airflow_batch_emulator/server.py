"""The HTTP server (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive) and the ``BatchEmulator`` facade.

Each request is read completely, checked for auth, rolled for HTTP faults, routed, and answered
with an exact ``Content-Length``; large bodies go out in 1 MiB pieces. ``/_emulator/*`` control
routes need no auth and are never faulted.

A route delay (``Faults.delay_routes`` / ``delay_after_routes``) holds the request in its handler
thread and watches the socket meanwhile: a client that hangs up (a killed process) ends the wait
at once, and a request delayed *before* its route is then dropped undone. ``GET /_emulator/stats``
lists each held call (``http.delayed_calls``: id, phase, request, client ``host:port``, seconds
held) and ``POST /_emulator/release`` ends the hold of chosen ones early, so a test decides in
which order held calls land. With ``process_after_hangup`` a request whose client hung up during
a before-route hold stays held (and listed) until its hold ends or is released, then runs
unanswered. ``lose_answer_*`` runs the route and then answers 500 or drops the connection.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl

import orjson

from airflow_batch_emulator.anthropic_api import AnthropicApi
from airflow_batch_emulator.anthropic_batch import AnthropicRunner
from airflow_batch_emulator.bedrock_api import BedrockApi, bedrock_error, is_bedrock_path
from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.engine import Engine
from airflow_batch_emulator.extensions import load_route_sets
from airflow_batch_emulator.faults import Faults
from airflow_batch_emulator.gemini_api import GeminiApi, gemini_error, is_gemini_path, is_upload_session
from airflow_batch_emulator.openai_api import OpenAIApi
from airflow_batch_emulator.openai_batch import OpenAIRunner
from airflow_batch_emulator.scheduling import RealtimeScheduler
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.transport import Handler, HttpServer
from airflow_batch_emulator.wire import (
    ApiError,
    ErrorFactory,
    Request,
    Response,
    anthropic_error,
    json_response,
    openai_error,
)

log = logging.getLogger("airflow_batch_emulator")

_Route = tuple[str, "re.Pattern[str]", Any]


class BatchEmulator:
    """A local OpenAI + Anthropic batch API server for tests and demos.

    ``start()`` binds (port 0 picks a free port) and serves from daemon threads; ``stop()`` shuts
    everything down. Use it as a context manager to do both. ``stats()``, ``reset()``,
    ``set_faults(**kwargs)`` and ``batches()`` act in-process, like the ``/_emulator`` routes.
    """

    def __init__(self, config: EmulatorConfig | None = None) -> None:
        self.config = config or EmulatorConfig()
        self.store = Store(self.config.faults)
        self.store.scheduler = RealtimeScheduler(self.config.realtime_slots, self.config.scheduling_policy)
        openai_runner = OpenAIRunner(self.store, self.config.latency, self.config.slice_size)
        anthropic_runner = AnthropicRunner(self.store, self.config.latency, self.config.slice_size)
        self.engine = Engine(self.store, openai_runner, anthropic_runner)
        self.bedrock = BedrockApi(self.store, self.config)  # owns its job worker and S3 endpoint
        self.gemini = GeminiApi(self.store, self.config)  # owns its job worker (started by the first create)
        self.openai_api = OpenAIApi(self.store, openai_runner, self.config)
        self._routes: list[_Route] = []
        self._route_names: dict[tuple[str, str], str] = {}
        # Route sets of installed packages (entry points, .extensions): Azure's, or another backend's fake.
        self.extensions = load_route_sets(self)
        self._key_headers = ("x-api-key", "x-goog-api-key", *(h for ext in self.extensions for h in ext.key_headers))
        for method, pattern, handler in [
            *self.openai_api.routes(),
            *AnthropicApi(self.store, anthropic_runner, self.config).routes(),
            *self.bedrock.routes(),
            *self.gemini.routes(),
            *(route for extension in self.extensions for route in extension.routes()),
        ]:
            self._routes.append((method, re.compile(pattern), handler))
            # The route's name in stats (``routes``), as route delays spell it: ``GET /v1/batches/{batch_id}``.
            self._route_names[method, pattern] = f"{method} " + re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle --------------------------------------------------------------------------------

    def start(self) -> BatchEmulator:
        """Bind and start serving in a daemon thread; return self."""
        if self._server is not None:
            return self
        self._server = HttpServer((self.config.host, self.config.port), self)
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
        self.gemini.close()
        for extension in self.extensions:
            extension.close()

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
        self.engine.anthropic.cache.clear()
        self.engine.openai.cache.clear()
        self.bedrock.runner.reset()
        self.gemini.reset()
        for extension in self.extensions:
            extension.reset()

    def set_faults(self, **settings: Any) -> Faults:
        """Replace the fault settings (fields not given go back to off) and return them."""
        faults = Faults.from_mapping(settings)
        self.store.set_faults(faults)
        return faults

    def release(self, ids: list[int] | None = None) -> list[int]:
        """End the hold of the held calls ``ids`` (all when None) now; return the ids released."""
        return self.store.release(ids)

    @property
    def faults(self) -> Faults:
        """The fault settings in force."""
        return self.store.faults

    def batches(self, include_custom_ids: bool = False) -> list[dict[str, Any]]:
        """List every batch of both providers with its status and custom_id count."""
        bedrock, gemini = self.bedrock.batches(include_custom_ids), self.gemini.batches(include_custom_ids)
        others = [batch for extension in self.extensions for batch in extension.batches(include_custom_ids)]
        return self.store.batches(include_custom_ids) + bedrock + gemini + others

    # dispatch ---------------------------------------------------------------------------------

    def dispatch(self, handler: Handler) -> None:
        """Answer one request on ``handler``."""
        path, _, qs = handler.path.partition("?")
        family: ErrorFactory = anthropic_error if path.startswith("/v1/messages") else openai_error
        family = bedrock_error if is_bedrock_path(path) else family
        family = gemini_error if is_gemini_path(path) else family
        family = next((ext.error for ext in self.extensions if ext.prefix and path.startswith(ext.prefix)), family)
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

    def _api(self, req: Request, handler: Handler, family: ErrorFactory) -> Response:
        self.store.bump("http", "requests")
        auth = req.headers.get("Authorization", "")
        bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        signed = auth.startswith("AWS4-HMAC-SHA256 ")  # boto3 signs with SigV4 (Bedrock routes)
        # Gemini: x-goog-api-key (its upload chunks carry none: the upload id authorises them); Azure: api-key.
        keyed = any(req.headers.get(header, "").strip() for header in self._key_headers)
        if not bearer and not signed and not keyed and not is_upload_session(req):
            return family(401, "authentication_error", "Missing or empty API key.").response()
        faulted = self._http_fault(handler, family)
        if faulted is not None:
            return faulted
        before, after = self.store.faults.route_delay(req.method, req.path)
        if before:
            self._delay(handler, req, before, "before", family)
        response = self._route(req, family)
        if after:
            self._delay(handler, req, after, "after", family)
        if response.status < 400 and self.store.dice.lose_answer(self.store.faults, req.method, req.path):
            return self._lose_answer(handler, req, family)
        return response

    def _lose_answer(self, handler: Handler, req: Request, family: ErrorFactory) -> Response:
        """The route took effect; its client gets a 500 or a dropped connection instead of the answer."""
        self.store.bump("http", "answers_lost")
        log.info("%s %s took effect; its answer is lost (fault lose_answer_*)", req.method, req.path)
        if self.store.faults.lose_answer_as == "drop":
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            raise ConnectionAbortedError("answer dropped on purpose")
        return family(500, "api_error", "Internal server error (emulator fault lose_answer).").response()

    def _http_fault(self, handler: Handler, family: ErrorFactory) -> Response | None:
        """Roll the HTTP fault dice: return the injected error, drop the connection, or None to go on."""
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
        return None

    def _route(self, req: Request, family: ErrorFactory) -> Response:
        """Answer ``req`` with the first matching route (404 when none matches)."""
        for method, pattern, route in self._routes:
            match = pattern.fullmatch(req.path)
            if match and method == req.method:
                req.params = match.groupdict()
                # Per-route calls: how many status retrieves vs list calls a poller made.
                self.store.bump("routes", self._route_names[method, pattern.pattern])
                try:
                    response: Response = route(req)
                except ApiError as exc:
                    response = exc.response()
                except Exception:
                    log.exception("emulator error on %s %s", req.method, req.path)
                    response = family(500, "api_error", "The emulator failed on this request.").response()
                return response
        return family(404, "not_found_error", f"Invalid URL ({req.method} {req.path})").response()

    def _delay(self, handler: Handler, req: Request, seconds: float, phase: str, family: ErrorFactory) -> None:
        """Hold one request ``seconds`` (fault ``delay_routes`` / ``delay_after_routes``).

        Raise ``ConnectionAbortedError`` when the client hangs up meanwhile, so nothing more is
        done for it: before the route that means the call never happened; after it, the work is
        done but the answer is lost.
        """
        what = f"{req.method} {req.path}"
        host, port = handler.client_address[:2]
        call = self.store.delay_enter(phase, what, f"{host}:{port}")
        log.info("delaying %s %s the route by %g s (fault; held call %d)", what, phase, seconds, call.id)
        ends = time.monotonic() + seconds
        try:
            alive = handler.wait_or_hangup(seconds, call.release)
            if not alive and phase == "before" and self.store.faults.process_after_hangup:
                # A slow proxy still delivers what its client gave up on: finish the hold, then run.
                call.release.wait(max(0.0, ends - time.monotonic()))
        finally:
            self.store.delay_exit(call)
        if not alive and phase == "before" and self.store.faults.process_after_hangup:
            self.store.bump("http", "processed_after_hangup")
            log.info("client hung up while %s was held; it runs anyway, unanswered", what)
            handler.close_connection = True
            self._route(req, family)
            raise ConnectionAbortedError("client hung up; the request ran anyway")
        if not alive:
            self.store.bump("http", "delayed_abandoned")
            log.info("client hung up while %s was delayed %s the route; nothing is answered", what, phase)
            handler.close_connection = True
            raise ConnectionAbortedError(f"client hung up during a {phase}-route delay")

    def _release(self, req: Request) -> Response:
        """``POST /_emulator/release`` ``{"ids": [...]}`` (or no body: all): end those holds now."""
        try:
            ids = (orjson.loads(req.body) if req.body else {}).get("ids")
            if ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)):
                raise ValueError("'ids' must be a list of held-call ids (http.delayed_calls[].id)")
        except (ValueError, AttributeError) as exc:
            return json_response({"error": f"release expects {{'ids': [int, ...]}} or nothing: {exc}"}, 400)
        return json_response({"released": self.store.release(ids)})

    def _control(self, req: Request) -> Response:
        route = (req.method, req.path.rstrip("/"))
        plain: dict[tuple[str, str], Callable[[], Any]] = {
            ("GET", "/_emulator/stats"): self.stats,
            ("GET", "/_emulator/health"): lambda: {"ok": True},
            ("POST", "/_emulator/hurry"): lambda: {"hurried": self.store.hurry()},
        }
        if route in plain:
            return json_response(plain[route]())
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
        if route == ("POST", "/_emulator/release"):
            return self._release(req)
        if route == ("GET", "/_emulator/batches"):
            include = req.query.get("custom_ids", "") in ("1", "true")
            return json_response({"data": self.batches(include)})
        return json_response({"error": f"unknown control route {req.method} {req.path}"}, 404)
