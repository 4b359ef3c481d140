"""Kafka backend (confluent-kafka / librdkafka): a consumer group's partition assignment as the claim.

``send`` waits for the idempotent producer's delivery report (``acks=all``), so the HTTP intake
answers 202 only for a record the brokers hold. ``receive`` polls the group and holds what it read
(:mod:`.kafka_records`), each record claimed for ``claim_seconds``; ``ack`` commits each partition
only up to its first record still held (a gap holds the commit; everything after it is read again
after a rebalance, and the idempotent output absorbs it). ``release`` re-produces the record behind
the partition with its id, attempts and a not-before time, then acks the original, so nothing waits
behind a failing message. ``dead_letter`` produces to ``<name>.dead`` with reason / id / attempts
headers, then acks. ``stats`` is the group's lag (:mod:`.kafka_group`).

The assignment is kept while a group is in flight by ``extend`` (the worker's heartbeat, every third
of ``claim_seconds``): it polls the paused consumer, so ``max.poll.interval.ms`` never passes, and a
partition revoked meanwhile is reported as lost claims. A dead process stops heartbeating and loses
its partitions after ``session.timeout.ms``. docs/streaming.md ("Kafka") has the why of each choice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow_batch_provider.intake.queues.base import BatchQueue, Delivery, QueueStats
from airflow_batch_provider.intake.queues.kafka_client import (
    DEFAULT_BOOTSTRAP,
    TIMEOUT_S,
    KafkaUnavailableError,
    check_topic,
    connection_settings,
    consumer_settings,
    create_topics,
    describe,
    producer_settings,
)
from airflow_batch_provider.intake.queues.kafka_group import (
    commit_covered,
    lag,
    read_dead_letters,
    record_of,
    stamps_at,
)
from airflow_batch_provider.intake.queues.kafka_records import (
    ATTEMPTS_HEADER,
    MESSAGE_ID_HEADER,
    NOT_BEFORE_HEADER,
    REASON_HEADER,
    SOURCE_HEADER,
    Held,
)

log = logging.getLogger(__name__)

GROUP = "aggregator"
JOIN_TIMEOUT_S = 30.0
FETCH_WAIT_S = 0.5  # a receive ends when the broker had nothing more within this
PRODUCER_ID_WAIT_S = 0.6


class KafkaQueue(BatchQueue):
    """A Kafka topic read by consumer group ``group``, with a ``<name>.dead`` topic."""

    backend = "kafka"

    def __init__(
        self,
        name: str,
        *,
        bootstrap_servers: str | None = None,
        conn_id: str | None = None,
        group: str = GROUP,
        create_partitions: int | None = None,
        session_timeout_ms: int = 10_000,
        max_poll_interval_ms: int = 300_000,
    ) -> None:
        super().__init__(name)
        self.conn_id = conn_id
        self.group = group
        self.create_partitions = create_partitions
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self._secrets, conn_bootstrap = connection_settings(conn_id)
        self.bootstrap_servers = bootstrap_servers or conn_bootstrap or DEFAULT_BOOTSTRAP
        self.dead_name = f"{name}.dead"
        self._held = Held()
        self._joined = False
        self._stamps: dict[tuple[int, int], float] = {}
        self._partitions = 0
        self._lock = threading.RLock()  # the worker's heartbeat thread calls extend beside ack / release

    @property
    def _base(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self._secrets}

    def _where(self) -> str:
        return describe(self.name, self.bootstrap_servers)

    @cached_property
    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self._base)
        if self.create_partitions:
            create_topics(admin, [self.name, self.dead_name], self.create_partitions)
        self._partitions = check_topic(admin, self.name, self.bootstrap_servers)
        return admin

    @cached_property
    def _producer(self) -> Any:
        from confluent_kafka import Producer

        _ = self._admin  # the topic exists before anything is produced to it
        producer = Producer(producer_settings(self._base))
        # Connect, learn the partitions and let the idempotent producer get its id (about 0.5 s, in the
        # background) now: a record's timestamp is taken when it is produced, and the first send would
        # otherwise wait for all that with its age already running.
        producer.list_topics(self.name, timeout=TIMEOUT_S)
        _ = self._probe  # the producer's callers read the lag next (backpressure): connect it now
        producer.poll(PRODUCER_ID_WAIT_S)
        return producer

    @cached_property
    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        _ = self._admin  # the topic exists
        settings = consumer_settings(
            self._base,
            self.group,
            session_timeout_ms=self.session_timeout_ms,
            max_poll_interval_ms=self.max_poll_interval_ms,
        )
        consumer = Consumer({**settings, "client.id": f"{os.uname().nodename}-{os.getpid()}"})
        consumer.subscribe([self.name], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        return consumer

    @cached_property
    def _probe(self) -> Any:
        """A consumer of the same group that never joins it: reads committed offsets and watermarks."""
        from confluent_kafka import Consumer, TopicPartition

        _ = self._admin  # the topic exists
        # fetch.wait.max.ms: it reads single records (the oldest waiting one); never wait for more to arrive.
        probe = Consumer({**self._base, "group.id": self.group, "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        probe.committed([TopicPartition(self.name, 0)], timeout=TIMEOUT_S)  # finds the group's coordinator now
        return probe

    # -- producing ---------------------------------------------------------------------------------

    def send(self, body: bytes) -> str:
        """Produce one record and wait for the brokers' acknowledgement; return ``<partition>-<offset>``."""
        partition, offset = self._produce(self.name, body, {})
        return f"{partition}-{offset}"

    def _produce(self, topic: str, body: bytes, headers: dict[str, str]) -> tuple[int, int]:
        from confluent_kafka import KafkaException

        done = threading.Event()
        report: dict[str, Any] = {}

        def delivered(error: Any, message: Any) -> None:
            report.update(error=error, message=message)
            done.set()

        try:
            self._producer.produce(topic, body, headers=list(headers.items()), on_delivery=delivered)
        except (KafkaException, BufferError) as exc:
            raise KafkaUnavailableError(f"{describe(topic, self.bootstrap_servers)}: produce failed ({exc})") from None
        deadline = time.monotonic() + TIMEOUT_S * 3
        while not done.is_set() and time.monotonic() < deadline:
            self._producer.poll(0.05)
        if not done.is_set() or report["error"] is not None:
            why = report.get("error") or "no delivery report in time"
            raise KafkaUnavailableError(f"{describe(topic, self.bootstrap_servers)}: not delivered ({why})")
        return int(report["message"].partition()), int(report["message"].offset())

    # -- consuming ---------------------------------------------------------------------------------

    def receive(self, max_items: int, claim_seconds: float) -> list[Delivery]:
        """Hand out up to ``max_items``: lapsed claims and released copies first, then new records."""
        with self._lock:
            self._join()
            self._consumer.resume(self._consumer.assignment())
            self._fetch(max_items, 0)  # also serves rebalance callbacks when nothing is unread
            deadline = time.monotonic() + TIMEOUT_S
            while len(self._held.available(time.time(), max_items)) < max_items and self._unread():
                self._fetch(max_items, FETCH_WAIT_S)
                if time.monotonic() > deadline:
                    break
            now = time.time()
            out = []
            for record in self._held.available(now, max_items):
                record.handed += 1
                record.claimed_until = now + claim_seconds
                out.append(record.delivery())
            return out

    def _join(self) -> None:
        """Poll until this consumer has joined the group (with no partition when the group has more members)."""
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not self._joined:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"{self._where()}: this consumer could not join consumer group {self.group!r} within "
                    f"{JOIN_TIMEOUT_S:.0f} s (is the broker up?)"
                )
            self._fetch(1, 0.2)

    def _unread(self) -> int:
        """Records in this consumer's partitions it has not read yet (so an empty topic costs no wait)."""
        from confluent_kafka import TopicPartition

        assigned = [tp for tp in self._consumer.assignment() if tp.partition not in self._held.next_offset]
        start = (
            {tp.partition: tp.offset for tp in self._consumer.committed(assigned, timeout=TIMEOUT_S)}
            if assigned
            else {}
        )
        start.update(self._held.next_offset)
        unread = 0
        for partition, offset in start.items():
            # The probe answers at once; the group member's own request waits behind its fetch long-poll.
            low, high = self._probe.get_watermark_offsets(TopicPartition(self.name, partition), timeout=TIMEOUT_S)
            unread += max(0, high - (offset if offset >= 0 else low))
        return unread

    def _fetch(self, count: int, timeout: float) -> int:
        """Read up to ``count`` records into the held set; return how many."""
        from confluent_kafka import KafkaError

        kept = 0
        for message in self._consumer.consume(num_messages=count, timeout=timeout):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    raise KafkaUnavailableError(f"{self._where()} does not exist (any more): {error.str()}")
                log.warning("queue %s: consumer error %s", self.name, error.str())
                continue
            self._held.add(record_of(message))
            kept += 1
        return kept

    def extend(self, receipts: Sequence[str], claim_seconds: float) -> set[str]:
        """Renew the claims still held; return the others (their partition was revoked, or acked).

        It also polls the paused consumer, which keeps its group membership (``max.poll.interval.ms``)
        and runs a pending rebalance: a partition revoked there is reported lost at once.
        """
        with self._lock:
            if "_consumer" in self.__dict__:
                self._consumer.pause(self._consumer.assignment())
                self._fetch(100, 0)  # nothing is lost: whatever comes back is held, handed out later
            until = time.time() + claim_seconds
            lost = set()
            for receipt in receipts:
                record = self._held.get(receipt)
                if record is None:
                    lost.add(receipt)
                else:
                    record.claimed_until = until
            return lost

    def ack(self, receipts: Sequence[str]) -> None:
        """Drop the records and commit each touched partition up to its first record still held.

        Receipts this consumer does not hold come from another process (the DAG's ``ack_group``
        task acknowledges what its ``collect_group`` task read) or from a partition since revoked:
        :func:`.kafka_group.commit_covered` commits them only where that skips no unanswered record.
        """
        with self._lock:
            partitions, foreign = set(), []
            for receipt in receipts:
                record = self._held.remove(receipt)
                if record is None:
                    foreign.append(receipt)
                else:
                    partitions.add(record.partition)
            self._commit(partitions)
        if foreign:
            commit_covered(self._probe, self.name, foreign, self._dead_reader)

    def _commit(self, partitions: set[int]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        points = {p: point for p in partitions if (point := self._held.commit_point(p)) is not None}
        offsets = [TopicPartition(self.name, p, offset) for p, offset in points.items()]
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # a rebalance took the partition: the new owner reads from the old commit
            log.warning("queue %s: commit failed (%s); those records will be read again", self.name, exc)

    def release(self, receipts: Sequence[str], after_seconds: float, claim_seconds: float) -> None:
        """Re-produce each record with its attempts and a not-before time, then ack the original."""
        with self._lock:
            not_before = time.time() + max(0.0, after_seconds)
            done = []
            for receipt in receipts:
                record = self._held.get(receipt)
                if record is None:
                    continue
                headers = {
                    MESSAGE_ID_HEADER: record.message_id,
                    ATTEMPTS_HEADER: str(record.attempts),
                    NOT_BEFORE_HEADER: f"{not_before:.3f}",
                }
                self._produce(self.name, record.body, headers)
                done.append(receipt)
            self.ack(done)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Produce to ``<name>.dead`` with reason, message id and attempts as headers, then ack here."""
        headers = {
            REASON_HEADER: reason[:1000],
            MESSAGE_ID_HEADER: delivery.message_id,
            ATTEMPTS_HEADER: str(delivery.attempts),
            SOURCE_HEADER: delivery.receipt,
        }
        self._produce(self.dead_name, delivery.body, headers)
        self.ack([delivery.receipt])

    # -- rebalance callbacks (run inside consume, on the thread holding the lock) -------------------

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._joined = True
        log.info("queue %s: assigned partitions %s", self.name, sorted(p.partition for p in partitions))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Commit what is contiguous, then give up the rest: the next owner reads it from there."""
        numbers = {p.partition for p in partitions}
        self._commit(numbers)
        self._forget(numbers, "revoked")

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._forget({p.partition for p in partitions}, "lost (session timed out)")

    def _forget(self, partitions: set[int], how: str) -> None:
        lost = self._held.forget(partitions)
        log.info("queue %s: partitions %s %s; %d claim(s) given up", self.name, sorted(partitions), how, len(lost))

    # -- reading the group's state -------------------------------------------------------------------

    def stats(self) -> QueueStats:
        """Depth = lag summed over partitions; waiting = depth - what this consumer holds claimed.

        Another process sees waiting = depth: Kafka does not tell what a group's members hold.
        """
        from confluent_kafka import KafkaException

        with self._lock:
            claimed = self._held.claimed(time.time())
        _ = self._admin  # checked the topic and counted its partitions (added partitions: restart)
        partitions = self._partitions
        try:
            depth, positions = lag(self._probe, self.name, partitions)
            waiting = max(0, depth - claimed)
            oldest = self._oldest(positions) if waiting else None
        except KafkaException as exc:
            raise KafkaUnavailableError(f"{self._where()}: could not read the group's lag ({exc})") from None
        return QueueStats(depth=depth, waiting=waiting, oldest_waiting_at=oldest)

    def _oldest(self, positions: list[Any]) -> float | None:
        """The oldest timestamp at ``positions``; a record's never changes, so each is read once."""
        wanted = {(tp.partition, tp.offset) for tp in positions}
        missing = [tp for tp in positions if (tp.partition, tp.offset) not in self._stamps]
        known = {where: stamp for where, stamp in self._stamps.items() if where in wanted}  # only current ones kept
        self._stamps = {**known, **(stamps_at(self._probe, missing) if missing else {})}
        return min(self._stamps.values()) if self._stamps else None

    def dead_letters(self) -> list[dict[str, Any]]:
        """Read ``<name>.dead`` from the start (a reader outside the group; nothing is committed)."""
        partitions = check_topic(self._admin, self.dead_name, self.bootstrap_servers)
        return read_dead_letters(self._dead_reader(), self.dead_name, partitions)

    def _dead_reader(self) -> Any:
        """A consumer outside every group for the dead-letter topic (the caller closes it)."""
        from confluent_kafka import Consumer

        return Consumer({**self._base, "group.id": f"{self.group}-dead-reader", "enable.auto.commit": False})

    def config(self) -> dict[str, Any]:
        """Return the config ``open_queue`` rebuilds this queue from (the connection id, never its secrets)."""
        return {
            "backend": "kafka",
            "name": self.name,
            "bootstrap_servers": self.bootstrap_servers,
            "conn_id": self.conn_id,
            "group": self.group,
            "create_partitions": self.create_partitions,
            "session_timeout_ms": self.session_timeout_ms,
            "max_poll_interval_ms": self.max_poll_interval_ms,
        }

    def delete(self) -> None:
        """Delete the topic and its dead-letter topic (this queue's clients are closed first)."""
        admin = self._admin
        self.close()
        futures = admin.delete_topics([self.name, self.dead_name], operation_timeout=TIMEOUT_S)
        for future in futures.values():
            future.result(TIMEOUT_S)

    def close(self) -> None:
        """Leave the group (its partitions move at once, not after a session timeout) and flush."""
        with self._lock:
            if "_consumer" in self.__dict__:
                self._consumer.close()
                del self.__dict__["_consumer"]
                self._joined = False
            if "_probe" in self.__dict__:
                self.__dict__.pop("_probe").close()
            if "_producer" in self.__dict__:
                self.__dict__.pop("_producer").flush(TIMEOUT_S)
            self.__dict__.pop("_admin", None)  # no close() on AdminClient: dropping the last reference ends it
