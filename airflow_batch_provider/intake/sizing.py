"""The intake's sizing signals (brief: "Sizing and backpressure") as ``llm_batch.intake.*`` metrics.

Tagged ``queue`` and ``backend`` on top of the usual ``provider``/``model``/``dag_id``; every
value is also logged by the caller, so a deployment without a metrics backend still sees it.

=================================  =======  ==========================================================
metric                             type     meaning
=================================  =======  ==========================================================
llm_batch.intake.queue_depth       gauge    messages not yet acknowledged; growing = under-provisioned
llm_batch.intake.accepted          counter  requests enqueued by producers
llm_batch.intake.rejected          counter  requests refused with 503 / QueueFullError (depth > max_depth)
llm_batch.intake.dead_lettered     counter  malformed messages moved to the dead-letter destination
llm_batch.intake.group_fill_rate   gauge    items in a flushed group ÷ max_items (3/64 = window too short)
llm_batch.intake.flush_latency_s   gauge    seconds from a group's first item to its flush
llm_batch.tokens_per_second        gauge    tokens of a group's answers ÷ seconds its generation took
=================================  =======  ==========================================================
"""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.metrics import (
    INTAKE_ACCEPTED,
    INTAKE_DEAD_LETTERED,
    INTAKE_FLUSH_LATENCY,
    INTAKE_GROUP_FILL_RATE,
    INTAKE_QUEUE_DEPTH,
    INTAKE_REJECTED,
    BatchMetrics,
    StatsBackend,
)


class IntakeMetrics(BatchMetrics):
    """``BatchMetrics`` with the queue's name and backend as extra tags."""

    def __init__(
        self,
        *,
        queue: str,
        backend: str,
        provider: str = "stream",
        model: str = "unknown",
        dag_id: str | None = None,
        stats: StatsBackend | None = None,
    ) -> None:
        super().__init__(provider=provider, model=model, dag_id=dag_id, stats=stats)
        self.tags = {**self.tags, "queue": queue, "backend": backend}

    def queue_depth(self, depth: int) -> None:
        """Gauge the unacknowledged messages."""
        self._emit("gauge", INTAKE_QUEUE_DEPTH, depth)

    def accepted(self, count: int = 1) -> None:
        """Count enqueued requests."""
        self._emit("incr", INTAKE_ACCEPTED, count)

    def rejected(self, count: int = 1) -> None:
        """Count requests refused for backpressure."""
        self._emit("incr", INTAKE_REJECTED, count)

    def dead_lettered(self, count: int) -> None:
        """Count malformed messages moved aside."""
        if count:
            self._emit("incr", INTAKE_DEAD_LETTERED, count)

    def group_flushed(self, items: int, max_items: int, latency_s: float) -> None:
        """Gauge the group's fill rate and flush latency."""
        self._emit("gauge", INTAKE_GROUP_FILL_RATE, items / max_items)
        self._emit("gauge", INTAKE_FLUSH_LATENCY, latency_s)

    def extra(self) -> dict[str, Any]:
        """Return the tags (for logs)."""
        return dict(self.tags)
