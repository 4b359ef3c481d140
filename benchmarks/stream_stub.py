"""A small OpenAI-compatible chat server for the intake's failure tests: it counts, fails and crashes on cue.

``POST /v1/chat/completions`` answers every request at once (``answer: <prompt>``) and counts
it by prompt, except:

- a prompt containing ``crash_marker`` calls ``on_crash`` (the test kills the worker that sent
  it: a message that crashes its worker) and is never answered;
- a prompt containing ``fail_marker`` gets HTTP 500, every time (a request that always fails).

It is a real HTTP server on 127.0.0.1 (the worker's ``openai`` SDK talks to it unchanged); the
repository's emulator has no per-prompt faults, which these tests need.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CRASH_MARKER = "POISON-CRASH"
FAIL_MARKER = "POISON-FAIL"


class StubServer:
    """Run the stub on a free port of 127.0.0.1 in a thread (a context manager)."""

    def __init__(
        self,
        *,
        crash_marker: str = CRASH_MARKER,
        fail_marker: str = FAIL_MARKER,
        on_crash: Callable[[], None] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.crash_marker = crash_marker
        self.fail_marker = fail_marker
        self.on_crash = on_crash
        self.delay = delay
        self.lock = threading.Lock()
        self.prompts: Counter[str] = Counter()
        self.server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="stream-stub", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``http://127.0.0.1:<port>/v1``)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def requests(self) -> int:
        """Model requests received so far (every try of every prompt)."""
        with self.lock:
            return sum(self.prompts.values())

    def tries(self, marker: str) -> int:
        """Requests received whose prompt contains ``marker``."""
        with self.lock:
            return sum(n for prompt, n in self.prompts.items() if marker in prompt)

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        """Return (HTTP status, JSON body), or (0, None) to leave the request unanswered."""
        messages = body.get("messages") or [{}]
        prompt = str(messages[-1].get("content", ""))
        with self.lock:
            self.prompts[prompt] += 1
        if self.crash_marker in prompt:
            if self.on_crash is not None:
                self.on_crash()
            return 0, None
        if self.fail_marker in prompt:
            return 500, {"error": {"message": "stub: this prompt always fails", "type": "server_error", "code": None}}
        if self.delay:
            time.sleep(self.delay)
        words = len(prompt.split())
        return 200, {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "stub"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answer: {prompt[:80]}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": words, "completion_tokens": 3, "total_tokens": words + 3},
        }

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that does not print a traceback when a client dies mid-request.

    The chaos run SIGKILLs workers with requests open on purpose; the reset is expected.
    """

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = {}
            status, payload = stub.answer(body if isinstance(body, dict) else {})
            if payload is None:  # the sender is being killed: hold the connection until it goes
                time.sleep(30)
                self.close_connection = True
                return
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
