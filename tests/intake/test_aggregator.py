"""Groups flush by size and by time; bad messages go to the dead-letter destination with the reason."""

from __future__ import annotations

import time

import orjson
import pytest

from airflow_batch_provider.intake.aggregator import Aggregator, GroupPolicy, ReadinessTracker
from airflow_batch_provider.intake.queues import QueueStats


def _send(queue, n, start=0):
    for i in range(start, start + n):
        queue.send(orjson.dumps({"request_id": f"r{i}", "prompt": f"prompt {i}"}))


@pytest.mark.parametrize(
    ("stats", "first_seen", "now", "ready"),
    [
        (QueueStats(depth=64, waiting=64), 100.0, 100.0, True),
        (QueueStats(depth=63, waiting=63), 100.0, 129.9, False),
        (QueueStats(depth=3, waiting=3), 100.0, 130.0, True),
        (QueueStats(depth=0, waiting=0), None, 500.0, False),
        (QueueStats(depth=5, waiting=0), None, 100.0 + 599, False),
        (QueueStats(depth=5, waiting=0), None, 100.0 + 600, True),
    ],
    ids=["full", "short-and-young", "old-enough", "empty", "claimed-recently", "claims-expired"],
)
def test_ready_rule(stats, first_seen, now, ready):
    assert GroupPolicy(max_items=64, max_wait=30, claim_seconds=600).ready(stats, first_seen, 100.0, now) is ready


def test_group_flushes_at_max_items(queue):
    policy = GroupPolicy(max_items=8, max_wait=3600, claim_seconds=60)
    tracker = ReadinessTracker(policy)
    _send(queue, 7)
    assert not tracker.observe(queue.stats(), time.time())
    _send(queue, 3, start=7)
    assert tracker.observe(queue.stats(), time.time())
    group = Aggregator(queue, policy).collect()
    assert len(group.requests) == 8  # SQS does not promise order
    assert queue.stats().waiting == 2


def test_group_flushes_after_max_wait_from_its_first_item(queue):
    policy = GroupPolicy(max_items=64, max_wait=1.0, claim_seconds=60)
    tracker = ReadinessTracker(policy)
    _send(queue, 3)
    assert not tracker.observe(queue.stats(), time.time())
    time.sleep(0.5)
    _send(queue, 1, start=3)  # a later item does not restart the group's clock
    assert not tracker.observe(queue.stats(), time.time())
    time.sleep(0.7)
    assert tracker.observe(queue.stats(), time.time())
    group = Aggregator(queue, policy).collect()
    assert len(group.requests) == 4
    assert group.flushed_at - group.first_enqueued_at >= 1.0


def test_malformed_messages_are_dead_lettered_with_the_reason_and_do_not_block(queue):
    _send(queue, 2)
    queue.send(b"{not json")
    queue.send(orjson.dumps({"request_id": "has space", "prompt": "p"}))
    queue.send(orjson.dumps({"request_id": "r9", "prompt": "   "}))
    queue.send(orjson.dumps({"request_id": "r8", "prompt": "p", "model": "x"}))
    aggregator = Aggregator(queue, GroupPolicy(max_items=10, claim_seconds=60))
    group = aggregator.collect()
    assert sorted(r.request_id for r in group.requests) == ["r0", "r1"]
    assert group.dead_lettered == 4
    reasons = sorted(d["reason"] for d in queue.dead_letters())
    assert any(r.startswith("not JSON") for r in reasons)
    assert any("request_id 'has space'" in r for r in reasons)
    assert any("r9: prompt must be a non-blank string" in r for r in reasons)
    assert any("unknown field(s) ['model']" in r for r in reasons)
    aggregator.complete(group)
    assert queue.stats().depth == 0  # nothing left behind to block the queue


def test_duplicate_request_ids_in_one_group_keep_one_request_and_ack_both(queue):
    queue.send(orjson.dumps({"request_id": "same", "prompt": "first"}))
    queue.send(orjson.dumps({"request_id": "same", "prompt": "again"}))
    aggregator = Aggregator(queue, GroupPolicy(max_items=10, claim_seconds=60))
    group = aggregator.collect()
    assert [(r.request_id, r.prompt) for r in group.requests] == [("same", "first")]
    aggregator.complete(group)
    assert queue.stats().depth == 0


def test_a_message_redelivered_too_often_goes_to_the_dead_letters(queue):
    _send(queue, 1)
    policy = GroupPolicy(max_items=10, claim_seconds=1, max_attempts=2)
    aggregator = Aggregator(queue, policy)
    for _ in range(2):  # two workers claim it and die without acking
        assert aggregator.collect() is not None
        time.sleep(1.3)
    assert aggregator.collect() is None
    (dead,) = queue.dead_letters()
    assert "delivered 3 times without its result being written" in dead["reason"]
    assert queue.stats().depth == 0
