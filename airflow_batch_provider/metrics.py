"""Emit the batch job's sizing and cost metrics through Airflow's metrics (StatsD, Datadog or OpenTelemetry).

Metrics go through ``airflow.sdk.observability.stats.Stats``, the task SDK's metrics facade
(Airflow 3.x), so they reach whichever backend the deployment configured under ``[metrics]``
and are dropped silently when none is. Every name starts with ``llm_batch.`` and every metric is
tagged ``provider``, ``model`` and ``dag_id``; ``docs/metrics.md`` lists them all. With plain
StatsD (no tag support) only the names arrive, so tag-dependent dashboards need Datadog, InfluxDB
tags or OpenTelemetry.

A metric can never fail a task: errors from the backend are logged once and swallowed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

PREFIX = "llm_batch"
TOKENS_PER_SECOND = f"{PREFIX}.tokens_per_second"
REQUESTS_IN_FLIGHT = f"{PREFIX}.requests_in_flight"
CHUNKS_WAITING = f"{PREFIX}.chunks_waiting"
BATCH_FILL_RATE = f"{PREFIX}.batch_fill_rate"
RESULTS = f"{PREFIX}.results"  # .<status>
TRUNCATED = f"{PREFIX}.truncated_answers"
DUPLICATES_CANCELLED = f"{PREFIX}.duplicate_batches_cancelled"
LATE_DUPLICATES = f"{PREFIX}.late_duplicate_batches"  # found by jobs reconcile (alert on any)
BATCHES = f"{PREFIX}.batches"  # .<terminal status>
INPUT_TOKENS = f"{PREFIX}.tokens.input"
OUTPUT_TOKENS = f"{PREFIX}.tokens.output"
COST_ACTUAL = f"{PREFIX}.cost_usd.actual"
COST_UPPER_BOUND = f"{PREFIX}.cost_usd.upper_bound"
COST_EXPECTED = f"{PREFIX}.cost_usd.expected"
COST_REALTIME = f"{PREFIX}.cost_usd.realtime_equivalent"
# Streaming intake (emitted through intake/sizing.py's IntakeMetrics; docs/streaming.md).
INTAKE_QUEUE_DEPTH = f"{PREFIX}.intake.queue_depth"
INTAKE_ACCEPTED = f"{PREFIX}.intake.accepted"
INTAKE_REJECTED = f"{PREFIX}.intake.rejected"
INTAKE_DEAD_LETTERED = f"{PREFIX}.intake.dead_lettered"
INTAKE_GROUP_FILL_RATE = f"{PREFIX}.intake.group_fill_rate"
INTAKE_FLUSH_LATENCY = f"{PREFIX}.intake.flush_latency_s"


class StatsBackend(Protocol):
    """The part of Airflow's ``Stats`` facade used here (what a test double must offer)."""

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict[str, Any] | None = None) -> None:
        """Increment a counter."""

    def gauge(
        self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: dict[str, Any] | None = None
    ) -> None:
        """Set a gauge."""


def airflow_stats() -> StatsBackend:
    """Return Airflow's metrics facade (the task SDK's ``Stats``)."""
    from airflow.sdk.observability.stats import Stats

    return Stats


def fill_rate(requests_per_chunk: Sequence[int], target: int) -> float:
    """Return mean requests per chunk ÷ target chunk size (1.0 = every chunk full)."""
    if target <= 0:
        raise ValueError(f"target chunk size must be positive, got {target!r}")
    if not requests_per_chunk:
        return 0.0
    return sum(requests_per_chunk) / len(requests_per_chunk) / target


class BatchMetrics:
    """Emit ``llm_batch.*`` metrics tagged with provider, model and dag_id.

    ``stats`` defaults to Airflow's ``Stats``; pass any object with ``incr`` and ``gauge``
    (an in-memory recorder in tests).
    """

    def __init__(
        self, *, provider: str, model: str, dag_id: str | None = None, stats: StatsBackend | None = None
    ) -> None:
        self.tags = {"provider": provider, "model": model, "dag_id": dag_id or "unknown"}
        self._stats = stats
        self._warned = False

    @classmethod
    def from_context(
        cls, context: Mapping[str, Any], *, provider: str, model: str, stats: StatsBackend | None = None
    ) -> BatchMetrics:
        """Build one for a running task, taking ``dag_id`` from the Airflow context."""
        dag = context.get("dag")
        ti = context.get("ti")
        dag_id = getattr(dag, "dag_id", None) or getattr(ti, "dag_id", None)
        return cls(provider=provider, model=model, dag_id=dag_id, stats=stats)

    @property
    def stats(self) -> StatsBackend:
        """Return the backend, resolving Airflow's facade on first use."""
        if self._stats is None:
            self._stats = airflow_stats()
        return self._stats

    def _emit(self, kind: str, stat: str, value: float, extra: Mapping[str, Any] | None = None) -> None:
        tags = {**self.tags, **(extra or {})}
        try:
            if kind == "gauge":
                self.stats.gauge(stat, value, tags=tags)
            else:
                self.stats.incr(stat, int(value), tags=tags)
        except Exception as err:  # a metrics backend must never fail the task
            if not self._warned:
                log.warning("Could not emit metric %s: %s (further metric errors are not logged)", stat, err)
                self._warned = True

    def tokens_per_second(self, tokens: int, seconds: float) -> None:
        """Gauge throughput: tokens processed (input + output) per second of job wall time."""
        if seconds > 0:
            self._emit("gauge", TOKENS_PER_SECOND, tokens / seconds)

    def requests_in_flight(self, count: int, *, chunk_index: int | None = None) -> None:
        """Gauge requests submitted but not finished (per chunk when ``chunk_index`` is given)."""
        self._emit("gauge", REQUESTS_IN_FLIGHT, count, None if chunk_index is None else {"chunk": str(chunk_index)})

    def chunks_waiting(self, count: int) -> None:
        """Gauge chunks written or submitted whose batch has not ended (the job's queue depth)."""
        self._emit("gauge", CHUNKS_WAITING, count)

    def batch_fill_rate(self, requests_per_chunk: Sequence[int], target: int) -> None:
        """Gauge mean requests per chunk ÷ target chunk size."""
        self._emit("gauge", BATCH_FILL_RATE, fill_rate(requests_per_chunk, target))

    def result_statuses(self, counts: Mapping[str, int]) -> None:
        """Count merged rows per result status: ``llm_batch.results.<status>``."""
        for status, count in sorted(counts.items()):
            if count:
                self._emit("incr", f"{RESULTS}.{status}", count)

    def truncated_answers(self, count: int) -> None:
        """Count merged answers cut off at max_tokens (``finish_reason`` ``length``), text or structured."""
        if count:
            self._emit("incr", TRUNCATED, count)

    def duplicates_cancelled(self, count: int) -> None:
        """Count batches cancelled because another batch of the same chunk (same idempotency key) is followed."""
        if count:
            self._emit("incr", DUPLICATES_CANCELLED, count)

    def late_duplicates(self, found: int, cancelled: int) -> None:
        """Count duplicates ``jobs reconcile`` found after the runs (``found``; alert) and cancelled (``cancelled``)."""
        if found:
            self._emit("incr", LATE_DUPLICATES, found)
        self.duplicates_cancelled(cancelled)

    def batch_ended(self, status: str) -> None:
        """Count one batch reaching a terminal status: ``llm_batch.batches.<status>`` (alert on failed)."""
        self._emit("incr", f"{BATCHES}.{status}", 1)

    def tokens(self, input_tokens: int, output_tokens: int) -> None:
        """Count tokens the provider reported."""
        self._emit("incr", INPUT_TOKENS, input_tokens)
        self._emit("incr", OUTPUT_TOKENS, output_tokens)

    def cost(self, usd: float | None, *, kind: str = "actual") -> None:
        """Gauge a USD cost: ``kind`` is ``actual``, ``upper_bound``, ``expected`` or ``realtime_equivalent``.

        ``upper_bound`` and ``expected`` are the pre-submit estimates (every answer at max_tokens, and
        at its expected length); None (an unpriced model) sends nothing.
        """
        names = {
            "actual": COST_ACTUAL,
            "upper_bound": COST_UPPER_BOUND,
            "expected": COST_EXPECTED,
            "realtime_equivalent": COST_REALTIME,
        }
        if kind not in names:
            raise ValueError(f"kind must be one of {sorted(names)}, got {kind!r}")
        if usd is not None:
            self._emit("gauge", names[kind], usd)
