"""Reading Kafka records into the queue's terms, and what it reads and commits from outside its group.

A probe is a consumer with the group's ``group.id`` that never subscribes: it reads committed
offsets and watermarks (the lag that backpressure and the trigger read), the record at a
committed offset (the oldest waiting one's age), the dead-letter topic, and commits for a
process that acknowledges records another process read (the DAG's ``ack_group`` task).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from airflow_batch_provider.intake.queues.kafka_client import TIMEOUT_S
from airflow_batch_provider.intake.queues.kafka_records import (
    ATTEMPTS_HEADER,
    MESSAGE_ID_HEADER,
    NOT_BEFORE_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    Record,
    parse_receipt,
)

log = logging.getLogger(__name__)


def headers_of(message: Any) -> dict[str, str]:
    """A record's headers as text (hostile input: undecodable bytes are replaced)."""
    return {key: (value or b"").decode("utf-8", errors="replace") for key, value in message.headers() or []}


def record_of(message: Any) -> Record:
    """A record as read; a copy re-produced by ``release`` keeps its first id and its attempts."""
    headers = headers_of(message)
    partition, offset = int(message.partition()), int(message.offset())
    try:
        earlier = int(headers.get(ATTEMPTS_HEADER, "0"))
        not_before = float(headers.get(NOT_BEFORE_HEADER, "0"))
    except ValueError:  # someone else's header: treat the record as new
        earlier, not_before = 0, 0.0
    return Record(
        partition=partition,
        offset=offset,
        message_id=headers.get(MESSAGE_ID_HEADER) or f"{partition}-{offset}",
        body=message.value() or b"",
        enqueued_at=message.timestamp()[1] / 1000,
        earlier_attempts=max(0, earlier),
        claimed_until=not_before,
    )


def lag(probe: Any, topic: str, partitions: int) -> tuple[int, list[Any]]:
    """Records after the committed offsets, summed; and the committed positions of partitions with some."""
    from confluent_kafka import TopicPartition

    depth, positions = 0, []
    for tp in probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=TIMEOUT_S):
        low, high = probe.get_watermark_offsets(tp, timeout=TIMEOUT_S)
        start = tp.offset if tp.offset >= 0 else low
        if high > start:
            depth += high - start
            positions.append(TopicPartition(topic, tp.partition, start))
    return depth, positions


def stamps_at(probe: Any, positions: list[Any]) -> dict[tuple[int, int], float]:
    """The timestamps (epoch s) of the records at ``positions``, by (partition, offset); one read each."""
    probe.assign(positions)
    wanted = {(tp.partition, tp.offset) for tp in positions}
    stamps: dict[tuple[int, int], float] = {}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(stamps) < len(wanted) and time.monotonic() < deadline:
            # Short waits: a call returns early only once num_messages came, and later records of a
            # partition (not wanted) count towards it.
            for message in probe.consume(num_messages=100, timeout=0.05):
                where = (message.partition(), message.offset())
                if message.error() is None and where in wanted:
                    stamps.setdefault(where, message.timestamp()[1] / 1000)
    finally:
        probe.unassign()
    return stamps


def read_dead_letters(reader: Any, topic: str, partitions: int) -> list[dict[str, Any]]:
    """Every record of the dead-letter topic, oldest first (``reader`` is closed afterwards)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    try:
        total = sum(
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)[1] for p in range(partitions)
        )
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        found: list[tuple[int, dict[str, Any]]] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(found) < total and time.monotonic() < deadline:
            for message in reader.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    headers = headers_of(message)
                    entry = {
                        "body": message.value() or b"",
                        "reason": headers.get(REASON_HEADER, ""),
                        "message_id": headers.get(MESSAGE_ID_HEADER, ""),
                    }
                    found.append((message.timestamp()[1], entry))
        return [entry for _stamp, entry in sorted(found, key=lambda f: f[0])]
    finally:
        reader.close()


def commit_covered(probe: Any, topic: str, receipts: Iterable[str], dead_reader: Callable[[], Any]) -> None:
    """Commit each partition up to the first offset neither in ``receipts`` nor dead-lettered.

    For a process that acknowledges records another process read (the DAG's ``ack_group`` task
    acks what ``collect_group`` read; that task dead-lettered the bad ones, leaving gaps): the
    dead letters name their source (``abp-source``) and are read from the oldest committed
    record's timestamp on (a record is dead-lettered after it was produced). A record still
    unanswered holds the commit, as in the reader: from it on, records are read again.
    """
    from confluent_kafka import KafkaException, TopicPartition

    by_partition = _offsets_by_partition(receipts)
    if not by_partition:
        return
    starts = {}
    for tp in probe.committed([TopicPartition(topic, p) for p in sorted(by_partition)], timeout=TIMEOUT_S):
        starts[tp.partition] = tp.offset if tp.offset >= 0 else probe.get_watermark_offsets(tp, timeout=TIMEOUT_S)[0]
    stamps = stamps_at(probe, [TopicPartition(topic, p, o) for p, o in starts.items()])
    dead = _dead_sources(dead_reader(), f"{topic}.dead", min(stamps.values())) if stamps else {}
    commits = []
    for partition, start in starts.items():
        covered = by_partition[partition] | dead.get(partition, set())
        point = start
        while point in covered:
            point += 1
        if point > start:
            commits.append(TopicPartition(topic, partition, point))
        if point <= max(by_partition[partition]):
            log.warning(
                "queue %s: partition %d has an unanswered record at offset %d before acknowledged ones; "
                "those are read again and their results rewritten under the same request id",
                topic,
                partition,
                point,
            )
    try:
        if commits:
            probe.commit(offsets=commits, asynchronous=False)
    except KafkaException as exc:  # live members hold the partitions: they commit them
        log.warning("queue %s: commit from outside the group failed (%s); read again later", topic, exc)


def _offsets_by_partition(receipts: Iterable[str]) -> dict[int, set[int]]:
    found: dict[int, set[int]] = {}
    for receipt in receipts:
        where = parse_receipt(receipt)
        if where is not None:
            found.setdefault(where[0], set()).add(where[1])
    return found


def _dead_sources(reader: Any, dead_topic: str, since: float) -> dict[int, set[int]]:
    """Source offsets by partition of the records dead-lettered at or after ``since`` (epoch s)."""
    from confluent_kafka import TopicPartition

    found: dict[int, set[int]] = {}
    try:
        count = len(reader.list_topics(dead_topic, timeout=TIMEOUT_S).topics[dead_topic].partitions)
        wanted = [TopicPartition(dead_topic, p, int(since * 1000)) for p in range(count)]
        starts = [tp for tp in reader.offsets_for_times(wanted, timeout=TIMEOUT_S) if tp.offset >= 0]
        left = sum(reader.get_watermark_offsets(tp, timeout=TIMEOUT_S)[1] - tp.offset for tp in starts)
        reader.assign(starts)
        deadline = time.monotonic() + TIMEOUT_S
        while left > 0 and time.monotonic() < deadline:
            for message in reader.consume(num_messages=100, timeout=0.5):
                if message.error() is None:
                    left -= 1
                    where = parse_receipt(headers_of(message).get(SOURCE_HEADER, ""))
                    if where is not None:
                        found.setdefault(where[0], set()).add(where[1])
        return found
    finally:
        reader.close()
