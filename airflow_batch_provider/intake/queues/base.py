"""The interface every queue backend implements, and the records it hands out.

The contract is at-least-once: ``receive`` *claims* messages for ``claim_seconds``; a claim
that is not acknowledged in time (the worker died, or was paused) makes the message deliverable
again, to any consumer. ``ack`` is called only after the message's result is durably written.
``extend`` (the heartbeat) renews only claims this consumer still holds and returns the ones it
lost, so a worker that wakes up after its claim lapsed learns it and stops sending them.
Backends differ in how they keep that promise (SQS: visibility timeout + receipt handle;
Redis Streams: consumer-group pending entries + ``XAUTOCLAIM``); callers never see the difference.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Delivery:
    """One claimed message.

    ``message_id`` is stable across redeliveries; ``receipt`` is what ``ack`` needs (it may
    change on every delivery, as SQS receipt handles do); ``enqueued_at`` is epoch seconds;
    ``attempts`` counts deliveries including this one.
    """

    message_id: str
    body: bytes
    receipt: str
    enqueued_at: float
    attempts: int


@dataclass(frozen=True)
class QueueStats:
    """How full the queue is.

    ``depth``: messages not yet acknowledged (waiting + claimed); this is what backpressure
    compares with ``max_depth``. ``waiting``: not yet handed to any consumer.
    ``oldest_waiting_at``: epoch seconds of the oldest waiting message, or None when the
    backend cannot tell (SQS) or nothing waits.
    """

    depth: int
    waiting: int
    oldest_waiting_at: float | None = None


class BatchQueue(ABC):
    """A named queue with claims, acknowledgements and a dead-letter destination."""

    backend: str = ""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def send(self, body: bytes) -> str:
        """Enqueue one message; return its message id."""

    @abstractmethod
    def stats(self) -> QueueStats:
        """Return depth, waiting count and the oldest waiting message's age when known."""

    async def astats(self) -> QueueStats:
        """Return ``stats()`` without blocking the event loop (triggers call this).

        The default runs the blocking client in a worker thread; a backend with an asyncio
        client overrides it.
        """
        return await asyncio.to_thread(self.stats)

    @abstractmethod
    def receive(self, max_items: int, claim_seconds: float) -> list[Delivery]:
        """Claim up to ``max_items`` messages for ``claim_seconds``, redeliveries of expired claims first.

        Every consumer of one queue must use the same ``claim_seconds``: SQS applies it when a
        message is claimed (visibility timeout), Redis when another consumer reclaims it
        (``XAUTOCLAIM``'s min-idle-time).
        """

    @abstractmethod
    def ack(self, receipts: Sequence[str]) -> None:
        """Acknowledge (delete) claimed messages; their results are durably written."""

    @abstractmethod
    def extend(self, receipts: Sequence[str], claim_seconds: float) -> set[str]:
        """Renew claims still being worked on (a heartbeat); return the receipts whose claim is lost.

        A renewal never takes a message back. A claim is lost when this consumer no longer holds
        the message: another consumer claimed it after this claim lapsed, or it was acknowledged
        and deleted. Those receipts are left as they are and returned (an empty set when every
        claim was renewed); the caller stops working on them: it does not send, ack or release
        them, because the message's new holder does. Raise only when the queue could not be asked
        at all (unreachable); a receipt whose fate is unknown is not reported lost.
        """

    @abstractmethod
    def release(self, receipts: Sequence[str], after_seconds: float, claim_seconds: float) -> None:
        """Give claimed messages back unanswered: deliverable again after ``after_seconds``, not acknowledged.

        Like ``extend``, it leaves alone a message this consumer no longer holds.
        """

    @abstractmethod
    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a message that can never succeed to the dead-letter destination, with the reason, and ack it."""

    @abstractmethod
    def dead_letters(self) -> list[dict[str, Any]]:
        """Return what the dead-letter destination holds (``body``, ``reason``, ``message_id``), oldest first."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """Return the JSON-able config ``open_queue`` rebuilds this queue from (no secrets)."""

    @abstractmethod
    def delete(self) -> None:
        """Remove the queue and its dead-letter destination (tests, demos)."""

    def close(self) -> None:  # noqa: B027 - optional hook; most clients need nothing
        """Release the client's connections."""

    def __enter__(self) -> BatchQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
