"""Queue backends behind one interface (:class:`~.base.BatchQueue`): SQS, Redis Streams and Kafka.

:func:`open_queue` builds one from a JSON-able config (``{"backend": "sqs" | "redis" | "kafka", "name": ...,
...}``), importing the backend's client library only then, so a DAG file loads without boto3 or
redis installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.intake.queues.base import BatchQueue, Delivery, QueueStats

#: backend name → "module:class" (docs/streaming.md).
BACKENDS: dict[str, str] = {
    "sqs": "airflow_batch_provider.intake.queues.sqs:SqsQueue",
    "redis": "airflow_batch_provider.intake.queues.redis_streams:RedisStreamQueue",
    "kafka": "airflow_batch_provider.intake.queues.kafka:KafkaQueue",
}

__all__ = ["BACKENDS", "BatchQueue", "Delivery", "QueueStats", "open_queue"]


def open_queue(config: Mapping[str, Any]) -> BatchQueue:
    """Return the queue a config describes (see each backend's ``__init__`` for its keys)."""
    settings = dict(config)
    backend = settings.pop("backend", None)
    if backend not in BACKENDS:
        raise InvalidInputError(
            f"queue backend {backend!r} is not one of {sorted(BACKENDS)}; set 'backend' in the config"
        )
    module_name, _, class_name = BACKENDS[backend].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    queue: BatchQueue = cls(**settings)
    return queue
