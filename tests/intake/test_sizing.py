"""The sizing signals reach the metrics backend: depth, fill rate, flush latency, rejections, dead letters, tokens/s."""

from __future__ import annotations

import pytest

from airflow_batch_provider.intake.aggregator import Aggregator, GroupPolicy
from airflow_batch_provider.intake.errors import QueueFullError
from airflow_batch_provider.intake.producer import BatchQueueProducer
from airflow_batch_provider.intake.sizing import IntakeMetrics
from tests.test_metrics import InMemoryStats


def test_producer_and_aggregator_emit_the_sizing_metrics(queue):
    stats = InMemoryStats()
    metrics = IntakeMetrics(queue=queue.name, backend=queue.backend, dag_id="d", stats=stats)
    producer = BatchQueueProducer(queue, max_depth=2, retry_after=5, depth_refresh_s=0, metrics=metrics)
    for i in range(3):
        producer.submit(f"p{i}")
    with pytest.raises(QueueFullError):
        producer.submit("refused")
    queue.send(b"[]")
    group = Aggregator(queue, GroupPolicy(max_items=8, claim_seconds=60), metrics).collect()
    assert len(group.requests) == 3
    assert [v for _, v, _ in stats.of("llm_batch.intake.accepted")] == [1, 1, 1]
    assert [v for _, v, _ in stats.of("llm_batch.intake.rejected")] == [1]
    assert [v for _, v, _ in stats.of("llm_batch.intake.queue_depth")][-1] == 3
    assert [v for _, v, _ in stats.of("llm_batch.intake.group_fill_rate")] == [3 / 8]
    assert [v for _, v, _ in stats.of("llm_batch.intake.dead_lettered")] == [1]
    (latency,) = stats.of("llm_batch.intake.flush_latency_s")
    assert 0 <= latency[1] < 30
    assert latency[2] == {
        "provider": "stream",
        "model": "unknown",
        "dag_id": "d",
        "queue": queue.name,
        "backend": queue.backend,
    }
    metrics.tokens_per_second(1000, 2.0)
    assert [v for _, v, _ in stats.of("llm_batch.tokens_per_second")] == [500.0]
