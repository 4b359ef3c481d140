"""The batch aggregator: when a group is ready, claim it; after its output is written, acknowledge it.

A group is ready when ``max_items`` messages wait, or when the oldest waiting one has waited
``max_wait`` seconds (brief: "flush every 30 s OR 64 items"). Readiness is a pure function of
the queue's stats (:meth:`GroupPolicy.ready`), so the same rule runs in a deferred trigger
(awaiting, never blocking: :mod:`airflow_batch_provider.triggers.intake`) and in the standalone
worker loop (:mod:`.worker`).

``collect`` claims up to ``max_items`` messages for ``claim_seconds``. A message that is not
an intake request, or that was delivered ``max_attempts`` times without its result ever being
written (a poison message that kills its worker), goes to the dead-letter destination with the
reason and is acknowledged there and then: it never blocks the queue and is never dropped
silently. Duplicate request ids in one group (a producer that retried) keep the first.
``complete`` acknowledges the group — call it only after the output is durably written.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_batch_provider.intake.errors import MalformedMessageError
from airflow_batch_provider.intake.messages import IntakeRequest
from airflow_batch_provider.intake.queues.base import BatchQueue, Delivery, QueueStats
from airflow_batch_provider.intake.sizing import IntakeMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupPolicy:
    """When to flush a group, and how long a claimed group may take before it is redelivered."""

    max_items: int = 64
    max_wait: float = 30.0
    claim_seconds: float = 600.0
    max_attempts: int = 5
    #: stream worker: sends alone (after halving its group down to one) that a crashing message gets
    alone_attempts: int = 2

    def __post_init__(self) -> None:
        attempts = min(self.max_attempts, self.alone_attempts)
        if self.max_items < 1 or self.max_wait < 0 or self.claim_seconds <= 0 or attempts < 1:
            raise ValueError(f"invalid group policy {self!r}: max_items, claim_seconds, max_attempts must be positive")

    def ready(self, stats: QueueStats, first_seen: float | None, idle_since: float, now: float) -> bool:
        """Return True when a group should be flushed now.

        ``first_seen``: epoch seconds of the oldest waiting message (from the backend, or when
        this waiter first saw the queue non-empty); ``idle_since``: when this waiter started,
        so that claims left behind by a dead worker are collected once ``claim_seconds`` passed.
        """
        if stats.waiting >= self.max_items:
            return True
        if stats.waiting and first_seen is not None and now - first_seen >= self.max_wait:
            return True
        stuck = stats.depth - stats.waiting
        return stuck > 0 and now - idle_since >= self.claim_seconds

    def to_dict(self) -> dict[str, Any]:
        """Return the policy as JSON-able kwargs."""
        return asdict(self)


@dataclass
class Group:
    """One flushed group: its requests (unique ids) and every receipt to acknowledge."""

    group_id: str
    requests: list[IntakeRequest]
    receipts: list[str]
    first_enqueued_at: float
    flushed_at: float
    dead_lettered: int = 0
    redelivered: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: the accepted deliveries (request id → its deliveries); kept in memory only, never in XCom
    deliveries: dict[str, list[Delivery]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Return an XCom-able dict."""
        data = asdict(self)
        data.pop("deliveries")
        data["requests"] = [{"request_id": r.request_id, "prompt": r.prompt} for r in self.requests]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        """Rebuild a group from ``to_dict``'s output."""
        values = dict(data)
        values["requests"] = [IntakeRequest(r["request_id"], r["prompt"]) for r in data["requests"]]
        return cls(**values)


class Aggregator:
    """Claim groups from ``queue`` under ``policy`` and acknowledge them once written."""

    def __init__(
        self,
        queue: BatchQueue,
        policy: GroupPolicy | None = None,
        metrics: IntakeMetrics | None = None,
        *,
        attempts_from_queue: bool = True,
    ):
        self.queue = queue
        self.policy = policy or GroupPolicy()
        self.metrics = metrics or IntakeMetrics(queue=queue.name, backend=queue.backend)
        # The stream worker counts tries itself (intake/ledger.py) and turns this off.
        self.attempts_from_queue = attempts_from_queue

    def collect(self) -> Group | None:
        """Claim up to ``max_items`` messages; dead-letter the bad ones; return the group (None if empty)."""
        deliveries = self.queue.receive(self.policy.max_items, self.policy.claim_seconds)
        requests: dict[str, IntakeRequest] = {}
        receipts: list[str] = []
        accepted: dict[str, list[Delivery]] = {}
        dead = redelivered = 0
        for delivery in deliveries:
            request = self._accept(delivery)
            if request is None:
                dead += 1
                continue
            redelivered += delivery.attempts > 1
            receipts.append(delivery.receipt)
            requests.setdefault(request.request_id, request)
            accepted.setdefault(request.request_id, []).append(delivery)
        self.metrics.dead_lettered(dead)
        if not receipts:
            return None
        kept_receipts = set(receipts)
        kept = [d for d in deliveries if d.receipt in kept_receipts]
        ids = sorted(d.message_id for d in kept)
        group = Group(
            group_id="g-" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16],
            requests=list(requests.values()),
            receipts=receipts,
            first_enqueued_at=min(d.enqueued_at for d in kept),
            flushed_at=time.time(),
            dead_lettered=dead,
            redelivered=redelivered,
            deliveries=accepted,
        )
        self._log_flush(group)
        return group

    def _accept(self, delivery: Delivery) -> IntakeRequest | None:
        if self.attempts_from_queue and delivery.attempts > self.policy.max_attempts:
            reason = (
                f"delivered {delivery.attempts} times without its result being written (max_attempts="
                f"{self.policy.max_attempts}); it may crash its worker — inspect it, then send it again"
            )
            self.queue.dead_letter(delivery, reason)
            log.warning("queue %s: message %s dead-lettered: %s", self.queue.name, delivery.message_id, reason)
            return None
        try:
            return IntakeRequest.decode(delivery.body, delivery.message_id)
        except MalformedMessageError as exc:
            self.queue.dead_letter(delivery, exc.reason)
            log.warning("queue %s: message %s dead-lettered: %s", self.queue.name, delivery.message_id, exc.reason)
            return None

    def _log_flush(self, group: Group) -> None:
        items = len(group.requests)
        latency = max(0.0, group.flushed_at - group.first_enqueued_at)
        self.metrics.group_flushed(items, self.policy.max_items, latency)
        log.info(
            "queue %s: flushed group %s: %d request(s) (fill rate %.2f of max_items=%d), first item waited %.1f s, "
            "%d redelivered, %d dead-lettered",
            self.queue.name,
            group.group_id,
            items,
            items / self.policy.max_items,
            self.policy.max_items,
            latency,
            group.redelivered,
            group.dead_lettered,
        )

    def complete(self, group: Group) -> None:
        """Acknowledge every message of ``group``: call only once its output is durably written."""
        self.queue.ack(group.receipts)
        log.info(
            "queue %s: acknowledged group %s (%d message(s))", self.queue.name, group.group_id, len(group.receipts)
        )


class ReadinessTracker:
    """Apply :meth:`GroupPolicy.ready` to successive stats, remembering when items were first seen.

    Times are epoch seconds (not monotonic) because the backends date messages in epoch time.
    For a backend that cannot date its oldest waiting message (SQS), the group's clock starts
    when this tracker first sees the queue non-empty: after a restart a group may wait up to
    ``max_wait`` longer, never less.
    """

    def __init__(self, policy: GroupPolicy, now: float | None = None) -> None:
        self.policy = policy
        self.idle_since = time.time() if now is None else now
        self.first_seen: float | None = None

    def observe(self, stats: QueueStats, now: float) -> bool:
        """Take one stats reading; return True when a group is ready."""
        if not stats.waiting:
            self.first_seen = None
        elif stats.oldest_waiting_at is not None:
            self.first_seen = stats.oldest_waiting_at
        elif self.first_seen is None:
            self.first_seen = now
        return self.policy.ready(stats, self.first_seen, self.idle_since, now)
