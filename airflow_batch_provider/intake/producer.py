"""The producer client: put one request on the queue, or refuse it when the queue is too deep.

Backpressure as the brief has it: ``if queue.depth > MAX_DEPTH: raise ServiceUnavailable(retry_after=30)``.
The depth is read at most every ``depth_refresh_s`` seconds (plus what this producer sent
since), so a hot producer does not double the queue's request rate just to ask how deep it is.
For batch work a delay is acceptable: the caller waits ``retry_after`` and sends again.
"""

from __future__ import annotations

import logging
import threading
import time

from airflow_batch_provider.intake.errors import QueueFullError
from airflow_batch_provider.intake.messages import IntakeRequest, new_request_id
from airflow_batch_provider.intake.queues.base import BatchQueue
from airflow_batch_provider.intake.sizing import IntakeMetrics

log = logging.getLogger(__name__)

DEFAULT_MAX_DEPTH = 10_000
DEFAULT_RETRY_AFTER = 30


class BatchQueueProducer:
    """Enqueue intake requests on ``queue`` with depth-based backpressure (thread-safe)."""

    def __init__(
        self,
        queue: BatchQueue,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        retry_after: int = DEFAULT_RETRY_AFTER,
        depth_refresh_s: float = 0.5,
        metrics: IntakeMetrics | None = None,
    ) -> None:
        if max_depth < 1 or retry_after < 1:
            raise ValueError(f"max_depth={max_depth!r} and retry_after={retry_after!r} must be >= 1")
        self.queue = queue
        self.max_depth = max_depth
        self.retry_after = retry_after
        self.depth_refresh_s = depth_refresh_s
        self.metrics = metrics or IntakeMetrics(queue=queue.name, backend=queue.backend)
        self._lock = threading.Lock()
        self._depth = 0
        self._read_at = -float("inf")
        self.accepted = 0
        self.rejected = 0

    def depth(self) -> int:
        """Return the queue's depth as last read, plus what was sent since."""
        with self._lock:
            stale = time.monotonic() - self._read_at >= self.depth_refresh_s
        if stale:
            depth = self.queue.stats().depth
            with self._lock:
                self._depth, self._read_at = depth, time.monotonic()
            self.metrics.queue_depth(depth)
        with self._lock:
            return self._depth

    def submit(self, prompt: str, request_id: str | None = None) -> str:
        """Enqueue one request; return its id. Raise ``QueueFullError`` when depth > max_depth.

        Send the same ``request_id`` again after a failure or a 503: the output keeps one row per id.
        """
        request = IntakeRequest(request_id or new_request_id(), prompt)
        body = request.encode()
        depth = self.depth()
        if depth > self.max_depth:
            with self._lock:
                self.rejected += 1
            self.metrics.rejected()
            raise QueueFullError(self.queue.name, depth, self.max_depth, self.retry_after)
        self.queue.send(body)
        with self._lock:
            self._depth += 1
            self.accepted += 1
        self.metrics.accepted()
        return request.request_id
