"""librdkafka settings for the Kafka queue, credentials from an Airflow connection, and topic checks.

The queue config (``open_queue``) holds no secret: ``conn_id`` names an Airflow connection whose
login / password are the SASL user and password and whose extra holds ``security_protocol``
(``SASL_SSL``), ``sasl_mechanism`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``) and
``ssl_ca_location``; its host (``host:port``, or a comma list in the extra's ``bootstrap_servers``)
is the bootstrap address when the config names none. The resulting dicts go to the clients only,
never to a log line: :func:`describe` is what errors and logs show.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.intake.errors import QueueUnavailableError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: connection extra key → librdkafka setting (the non-secret ones a managed Kafka needs).
EXTRA_SETTINGS = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_endpoint_identification_algorithm": "ssl.endpoint.identification.algorithm",
}
TIMEOUT_S = 10.0


class KafkaUnavailableError(QueueUnavailableError):
    """The broker cannot be reached or the topic does not exist; the message names both and what to do."""


def connection_settings(conn_id: str | None) -> tuple[dict[str, Any], str | None]:
    """librdkafka settings (SASL / TLS) from an Airflow connection, and its bootstrap address if it has one."""
    if not conn_id:
        return {}, None
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, Mapping) else json.loads(conn.extra or "{}")
    settings: dict[str, Any] = {key: str(extra[name]) for name, key in EXTRA_SETTINGS.items() if extra.get(name)}
    if conn.login:
        settings["sasl.username"] = conn.login
        settings["sasl.password"] = conn.password or ""
        settings.setdefault("security.protocol", "SASL_SSL")
        settings.setdefault("sasl.mechanism", "PLAIN")
    bootstrap = extra.get("bootstrap_servers") or (f"{conn.host}:{conn.port or 9092}" if conn.host else None)
    return settings, bootstrap


def producer_settings(base: Mapping[str, Any]) -> dict[str, Any]:
    """Idempotent producer: acks from every in-sync replica, no duplicates from its own retries."""
    return {
        **base,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,  # a send waits for its delivery report anyway; 5 ms lets concurrent sends share a request
        # Keyless records to a random partition each: one-at-a-time sends would otherwise stick to one.
        "sticky.partitioning.linger.ms": 0,
        "delivery.timeout.ms": int(TIMEOUT_S * 3 * 1000),
    }


def consumer_settings(
    base: Mapping[str, Any], group: str, *, session_timeout_ms: int, max_poll_interval_ms: int
) -> dict[str, Any]:
    """A group member that commits by hand and starts a new group at the oldest record."""
    return {
        **base,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,  # a receive should not sit on a broker's long-poll while records wait
        "allow.auto.create.topics": False,
        # Incremental rebalancing: partitions that stay with a member are not revoked when another
        # joins or leaves, so its claims on them survive the rebalance.
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(100, session_timeout_ms // 5),
        "max.poll.interval.ms": max_poll_interval_ms,
    }


def describe(topic: str, bootstrap: str) -> str:
    """What errors and logs name: the topic and the bootstrap address, never credentials."""
    return f"Kafka topic {topic!r} at {bootstrap}"


def check_topic(client: Any, topic: str, bootstrap: str) -> int:
    """Return the topic's partition count; raise KafkaUnavailableError if the broker or the topic is missing."""
    from confluent_kafka import KafkaException

    try:
        # All topics, not list_topics(topic): a request naming the topic may have the broker create it.
        metadata = client.list_topics(timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"{describe(topic, bootstrap)}: the broker did not answer ({exc.args[0]}); check bootstrap_servers "
            "and that the broker is up"
        ) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise KafkaUnavailableError(
            f"{describe(topic, bootstrap)} does not exist; create it (and {topic}.dead) with the partitions you "
            "want, or set create_partitions in the queue config"
        )
    return len(found.partitions)


def create_topics(admin: Any, topics: list[str], partitions: int) -> None:
    """Create ``topics`` if missing (tests, demos, ``create_partitions``)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    existing = admin.list_topics(timeout=TIMEOUT_S).topics
    wanted = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics if t not in existing]
    for future in admin.create_topics(wanted, operation_timeout=TIMEOUT_S).values() if wanted else []:
        try:
            future.result(TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
