"""Errors of the streaming intake (all ``BatchProviderError``)::

IntakeError                  base of the intake's errors
├── QueueFullError           the queue is deeper than max_depth; come back after retry_after seconds
├── QueueUnavailableError    the queue service cannot be reached (or the queue is missing); nothing was enqueued
└── MalformedMessageError    a message is not a valid intake request (goes to the dead-letter queue)
"""

from __future__ import annotations

from airflow_batch_provider.exceptions import BatchProviderError


class IntakeError(BatchProviderError):
    """Base class of the streaming intake's errors."""


class QueueFullError(IntakeError):
    """Refuse a request because the queue holds more than ``max_depth`` messages.

    The producer's answer to this is to wait ``retry_after`` seconds and try again (the HTTP
    endpoint turns it into ``503`` with a ``Retry-After`` header). Nothing was enqueued.
    """

    def __init__(self, queue: str, depth: int, max_depth: int, retry_after: int) -> None:
        super().__init__(
            f"queue {queue!r} holds {depth} requests, more than max_depth={max_depth}; nothing was enqueued. "
            f"Send it again in {retry_after} s (the aggregator is behind: add capacity or raise max_depth)."
        )
        self.queue = queue
        self.depth = depth
        self.max_depth = max_depth
        self.retry_after = retry_after


class QueueUnavailableError(IntakeError):
    """The queue service did not answer, or the queue does not exist; the message names both. Nothing was enqueued.

    The HTTP endpoint answers ``503`` with ``Retry-After`` (the producer may send the same request again).
    """

    retry_after = 5


class MalformedMessageError(IntakeError):
    """Reject a message that is not a valid intake request; ``reason`` says what is wrong."""

    def __init__(self, reason: str, message_id: str | None = None) -> None:
        where = f"message {message_id}: " if message_id else ""
        super().__init__(f"{where}{reason}")
        self.reason = reason
        self.message_id = message_id
