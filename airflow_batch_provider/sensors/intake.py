"""QueueGroupSensor: wait, deferred, until the intake queue holds a group worth flushing (dags/stream_intake.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowSkipException

from airflow_batch_provider.intake.aggregator import ReadinessTracker
from airflow_batch_provider.intake.queues import open_queue
from airflow_batch_provider.intake.sizing import IntakeMetrics
from airflow_batch_provider.operators.intake import policy_from, queue_config_from
from airflow_batch_provider.triggers.intake import QueueGroupTrigger


class QueueGroupSensor(BaseSensorOperator):
    """Wait until the queue holds a group (``max_items`` waiting, or the oldest waited ``max_wait`` s).

    The first check is made in the worker; after that the task defers to :class:`QueueGroupTrigger`
    (which only awaits) and holds no worker slot while the queue fills.
    """

    template_fields: Sequence[str] = ("queue_config", "max_items", "max_wait_seconds", "claim_seconds")
    ui_color = "#fff3e0"

    def __init__(
        self,
        *,
        queue_config: dict[str, Any] | str,
        max_items: int | str = 64,
        max_wait_seconds: float | str = 30.0,
        claim_seconds: float | str = 600.0,
        poll_interval: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poll_interval, **kwargs)
        self.queue_config = queue_config
        self.max_items = max_items
        self.max_wait_seconds = max_wait_seconds
        self.claim_seconds = claim_seconds
        self.poll_interval = poll_interval

    def poke(self, context: Context) -> bool:
        """Check the queue once (this process has no memory of earlier pokes, so max_wait uses the backend's dates)."""
        policy = policy_from(self.max_items, self.max_wait_seconds, self.claim_seconds)
        with open_queue(queue_config_from(self.queue_config)) as queue:
            stats = queue.stats()
        IntakeMetrics(queue=queue.name, backend=queue.backend, dag_id=self.dag_id).queue_depth(stats.depth)
        self.log.info("queue %s: depth %d, waiting %d", queue.name, stats.depth, stats.waiting)
        return ReadinessTracker(policy, now=time.time()).observe(stats, time.time())

    def execute(self, context: Context) -> Any:
        """Return at once when a group is ready; otherwise defer until it is."""
        if self.poke(context):
            return None
        policy = policy_from(self.max_items, self.max_wait_seconds, self.claim_seconds)
        trigger = QueueGroupTrigger(
            queue=queue_config_from(self.queue_config), policy=policy.to_dict(), poll_interval=self.poll_interval
        )
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        """Finish when the trigger saw a group; a timeout event fails the task (the next run waits again)."""
        if event.get("status") != "ready":
            raise AirflowSkipException(f"no group became ready: {event}")
        self.log.info("a group is ready: depth %s, waiting %s", event.get("depth"), event.get("waiting"))
