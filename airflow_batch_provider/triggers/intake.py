"""QueueGroupTrigger: wait on the triggerer until the intake queue holds a group worth flushing.

``run()`` only awaits: the queue's stats come from ``BatchQueue.astats()`` (the blocking client
in a worker thread, never on the event loop) and the wait between readings is
``asyncio.sleep``. It yields exactly one event and is safe to run twice: a restarted triggerer
reads the queue again (``started_at`` is kept, so claims left by a dead worker are still
collected ``claim_seconds`` after the wait began).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batch_provider.intake.aggregator import GroupPolicy, ReadinessTracker
from airflow_batch_provider.intake.queues import open_queue

log = logging.getLogger(__name__)


class QueueGroupTrigger(BaseTrigger):
    """Fire ``{"status": "ready", "depth", "waiting"}`` once a group is ready, or ``{"status": "timeout"}``.

    :param queue: the queue's config (``BatchQueue.config()``; JSON-able, no secrets).
    :param policy: ``GroupPolicy.to_dict()``.
    :param poll_interval: seconds between stats readings.
    :param started_at: epoch seconds when the wait began.
    :param timeout: seconds after ``started_at`` to give up (None: wait for ever).
    """

    def __init__(
        self,
        *,
        queue: dict[str, Any],
        policy: dict[str, Any],
        poll_interval: float = 1.0,
        started_at: float | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.queue = queue
        self.policy = policy
        self.poll_interval = poll_interval
        self.started_at = time.time() if started_at is None else started_at
        self.timeout = timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and kwargs."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue": self.queue,
                "policy": self.policy,
                "poll_interval": self.poll_interval,
                "started_at": self.started_at,
                "timeout": self.timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Read the queue's stats every ``poll_interval`` until a group is ready."""
        queue = open_queue(self.queue)
        tracker = ReadinessTracker(GroupPolicy(**self.policy), now=self.started_at)
        try:
            while True:
                stats = await queue.astats()
                now = time.time()
                if tracker.observe(stats, now):
                    log.info(
                        "queue %s: a group is ready (depth %d, waiting %d)", queue.name, stats.depth, stats.waiting
                    )
                    yield TriggerEvent({"status": "ready", "depth": stats.depth, "waiting": stats.waiting})
                    return
                if self.timeout is not None and now - self.started_at >= self.timeout:
                    yield TriggerEvent({"status": "timeout", "depth": stats.depth, "waiting": stats.waiting})
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await asyncio.to_thread(queue.close)
