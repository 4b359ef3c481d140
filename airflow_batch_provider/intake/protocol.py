"""The intake's HTTP/1.1 connections: uvicorn's h11 protocol with a deadline and a size cap on each request's head.

uvicorn bounds the rest itself (``limit_concurrency``: connections and requests at once, 503
past it; ``timeout_keep_alive``: an idle connection after an answer). What it leaves open, and an
attacker found: a connection that sends no request, or sends its headers a byte at a time, stays
open for ever (its keep-alive timer is reset by every byte, and there is none before the first
request); and with httptools (uvicorn's choice when installed) a header has no size limit and is
held in memory while it arrives, before the app can answer 401. So the intake always runs h11,
whose receive buffer is capped (``h11_max_incomplete_event_size``), answers a head over the cap
with 431, and closes a connection whose request head has not arrived within ``head_timeout_s`` of
connecting or of the previous answer with 408.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: The largest request head (request line and headers) read: a bearer JWT is 0.5-4 KB.
MAX_HEAD_BYTES = 16 * 1024
#: Seconds a connection may take to send a request's head, from connecting or from the previous answer.
HEAD_TIMEOUT_S = 10.0


def _answer(status: str, text: str) -> bytes:
    body = text.encode("ascii")
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode("ascii") + body


class BoundedH11Protocol(H11Protocol):
    """:class:`H11Protocol` that closes a connection whose request head is too slow (408) or too large (431)."""

    head_timeout_s: ClassVar[float] = HEAD_TIMEOUT_S
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()  # the next request's head: a kept-alive connection gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """Answer h11's refusal; 431 when it refused a head over the cap (uvicorn says 400 for every refusal)."""
        if len(self.conn.trailing_data[0]) <= MAX_HEAD_BYTES:
            super().send_400_response(msg)
            return
        self._refuse("431 Request Header Fields Too Large", f"the request head is over {MAX_HEAD_BYTES:,} bytes")

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        if not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        # IDLE: h11 has not seen a whole request head since the deadline was set (a request being
        # answered, or its body read, is past it: the body has its own deadline in the app).
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._refuse("408 Request Timeout", f"no request head within {self.head_timeout_s:g} s")

    def _refuse(self, status: str, text: str) -> None:
        self.logger.warning("closing a connection from %s: %s", self.client, text)
        self.transport.write(_answer(status, text))
        self.transport.close()


def bounded_protocol(head_timeout_s: float = HEAD_TIMEOUT_S) -> type[BoundedH11Protocol]:
    """Return the protocol class to give uvicorn (``Config(http=...)``) with this head deadline."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"head_timeout_s": head_timeout_s})
