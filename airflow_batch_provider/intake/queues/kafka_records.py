"""What a Kafka consumer holds between ``receive`` and ``ack``: its records, their claims, the commit points.

Kafka has no per-message claim or delete: a consumer group keeps one committed offset per partition,
and everything at or after it is read again after a rebalance. So the queue keeps, per partition,
the records it has read and not yet acknowledged, and commits only up to the first of them (the
contiguous acknowledged prefix). A record claimed longer than ``claim_seconds`` without an ack is
handed out again by the same consumer, as a lapsed SQS visibility timeout would be. Pure data: no
client calls here, so the bookkeeping is tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from airflow_batch_provider.intake.queues.base import Delivery

#: headers this backend writes; a record without them (another producer's) gets defaults.
MESSAGE_ID_HEADER = "abp-message-id"
ATTEMPTS_HEADER = "abp-attempts"
NOT_BEFORE_HEADER = "abp-not-before"
REASON_HEADER = "abp-reason"
SOURCE_HEADER = "abp-source"  # a dead letter's receipt in the topic: an ack from another process skips it


def receipt_of(partition: int, offset: int) -> str:
    """The receipt of one record: ``"<partition>:<offset>"``."""
    return f"{partition}:{offset}"


def parse_receipt(receipt: str) -> tuple[int, int] | None:
    """``(partition, offset)`` of a receipt, or None if it is not one of ours."""
    partition, sep, offset = receipt.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        return None
    return int(partition), int(offset)


@dataclass
class Record:
    """One record read from the topic and not yet acknowledged.

    ``claimed_until``: epoch seconds until which it is not handed out again (0: available now; a
    released copy's ``abp-not-before``). ``earlier_attempts``: deliveries before this copy was
    produced (from its ``abp-attempts`` header); ``handed`` counts this consumer's deliveries of it.
    """

    partition: int
    offset: int
    message_id: str
    body: bytes
    enqueued_at: float
    earlier_attempts: int = 0
    claimed_until: float = 0.0
    handed: int = 0

    @property
    def receipt(self) -> str:
        return receipt_of(self.partition, self.offset)

    @property
    def attempts(self) -> int:
        """Deliveries so far, counting the current one."""
        return self.earlier_attempts + self.handed

    def delivery(self) -> Delivery:
        return Delivery(self.message_id, self.body, self.receipt, self.enqueued_at, self.attempts)


@dataclass
class Held:
    """The records one consumer holds, by partition, and the next offset it read in each."""

    records: dict[int, dict[int, Record]] = field(default_factory=dict)
    next_offset: dict[int, int] = field(default_factory=dict)

    def add(self, record: Record) -> None:
        self.records.setdefault(record.partition, {})[record.offset] = record
        self.next_offset[record.partition] = max(self.next_offset.get(record.partition, 0), record.offset + 1)

    def get(self, receipt: str) -> Record | None:
        where = parse_receipt(receipt)
        if where is None:
            return None
        return self.records.get(where[0], {}).get(where[1])

    def remove(self, receipt: str) -> Record | None:
        record = self.get(receipt)
        if record is not None:
            del self.records[record.partition][record.offset]
        return record

    def available(self, now: float, limit: int) -> list[Record]:
        """Up to ``limit`` records not claimed at ``now``, oldest first (as near send order as Kafka tells)."""
        ready = sorted(
            (r for part in self.records.values() for r in part.values() if r.claimed_until <= now),
            key=lambda r: (r.enqueued_at, r.partition, r.offset),
        )
        return ready[:limit]

    def claimed(self, now: float) -> int:
        """How many records are claimed by a delivery right now (not the released ones still waiting)."""
        return sum(1 for part in self.records.values() for r in part.values() if r.handed and r.claimed_until > now)

    def commit_point(self, partition: int) -> int | None:
        """The offset to commit: the first record not acknowledged, or past the last one read."""
        if partition not in self.next_offset:
            return None
        pending = self.records.get(partition)
        return min(pending) if pending else self.next_offset[partition]

    def forget(self, partitions: Iterable[int]) -> list[str]:
        """Drop what this consumer held in ``partitions`` (revoked); return the receipts it loses."""
        lost: list[str] = []
        for partition in partitions:
            lost.extend(r.receipt for r in self.records.pop(partition, {}).values())
            self.next_offset.pop(partition, None)
        return lost
