"""The queue-level failure fixes, on both backends: size cap at decode, no duplicate in a collect, claim heartbeats
that never take a message back, collects sized to the endpoint's latency, stale consumers.

Real Redis (127.0.0.1:6379, a uuid-named stream per test) and moto's SQS server, as the other
intake tests. The slow endpoint of the SQS reproduction is moto itself with each receive call
delayed on the client side (a loaded machine, as in issue 26).
"""

from __future__ import annotations

import time

import orjson
import pytest

from airflow_batch_provider.intake.aggregator import Aggregator, GroupPolicy
from airflow_batch_provider.intake.messages import MAX_MESSAGE_BYTES
from airflow_batch_provider.intake.queues import open_queue
from tests.intake.conftest import queue_config

pytestmark = pytest.mark.stream


def test_an_oversized_message_written_straight_to_the_queue_is_dead_lettered(queue):
    big = orjson.dumps({"request_id": "big", "prompt": "x" * (MAX_MESSAGE_BYTES + 10)})
    queue.send(big)
    queue.send(b'{"request_id": "small", "prompt": "hello"}')
    group = Aggregator(queue, GroupPolicy(max_items=10)).collect()
    assert group is not None
    assert [r.request_id for r in group.requests] == ["small"]
    (dead,) = queue.dead_letters()
    assert "over the 262,144-byte cap" in dead["reason"]
    assert "not sent to the model" in dead["reason"]


def test_sqs_collect_keeps_each_message_once_when_claims_lapse_mid_collect(moto_url, monkeypatch):
    queue = open_queue(queue_config("sqs", moto_url))
    try:
        for i in range(40):
            queue.send(f'{{"request_id": "r{i}", "prompt": "p"}}'.encode())
        slow = queue.client.receive_message
        calls = []

        def slow_receive(**kwargs):  # the endpoint slows down after the first call: the next outlives a 1 s claim
            calls.append(1)
            time.sleep(0.0 if len(calls) == 1 else 1.2)
            return slow(**kwargs)

        monkeypatch.setattr(queue.client, "receive_message", slow_receive)
        got = queue.receive(64, claim_seconds=1)
        ids = [d.message_id for d in got]
        assert len(ids) == len(set(ids)) > 0
        assert all(d.attempts == 1 for d in got)
    finally:
        queue.delete()
        queue.close()


# Kafka's claim is a partition, and a second consumer joining takes some: tests/intake/test_kafka_queue.py.
@pytest.mark.parametrize("queue", ["sqs", "redis"], indirect=True)
def test_extend_keeps_a_claim_past_its_length_and_release_gives_it_back(queue):
    queue.send(b'{"request_id": "a", "prompt": "p"}')
    (first,) = queue.receive(10, claim_seconds=2)
    other = open_queue(queue.config())
    if hasattr(other, "consumer"):
        other.consumer = "another-worker"
    try:
        for _ in range(4):  # 3 s in all, past the 2 s claim: renewed every 0.75 s
            time.sleep(0.75)
            queue.extend([first.receipt], claim_seconds=2)
            assert other.receive(10, claim_seconds=2) == []
        queue.release([first.receipt], after_seconds=0, claim_seconds=2)
        time.sleep(0.2)
        again = other.receive(10, claim_seconds=2)
        assert [d.message_id for d in again] == [first.message_id]
    finally:
        other.close()


def test_stale_redis_consumers_are_removed():
    config = queue_config("redis", None)
    old = [open_queue({**config, "consumer": f"dead-worker-{i}"}) for i in range(3)]
    live = open_queue({**config, "consumer": "live-worker"})
    try:
        for q in old:  # each "restart" reads once and dies with nothing pending
            q.send(b'{"request_id": "a", "prompt": "p"}')
            got = q.receive(10, claim_seconds=0.2)
            q.ack([d.receipt for d in got])
        holder = open_queue({**config, "consumer": "dead-but-holding"})
        holder.send(b'{"request_id": "b", "prompt": "p"}')
        holder.receive(10, claim_seconds=60)  # still holds an entry: must be kept
        time.sleep(0.4)
        live.receive(10, claim_seconds=0.2)
        names = {c["name"].decode() for c in live.client.xinfo_consumers(live.name, "aggregator")}
        assert names == {"live-worker", "dead-but-holding"}
    finally:
        live.delete()
        for q in [*old, live]:
            q.close()


@pytest.fixture(params=["sqs", "redis"])
def two_consumers(request):
    """Two consumers of one new queue (on Redis two consumer names), deleted after the test."""
    config = queue_config(request.param, request.getfixturevalue("moto_url") if request.param == "sqs" else None)
    first, second = (open_queue({**config, "consumer": n} if request.param == "redis" else config) for n in "AB")
    yield first, second
    first.delete()
    first.close()
    second.close()


def test_a_renewal_never_takes_a_message_back_and_reports_the_lost_claim(two_consumers):
    first, second = two_consumers
    for i in range(3):
        first.send(f'{{"request_id": "r{i}", "prompt": "p"}}'.encode())
    mine = [d.receipt for d in first.receive(10, claim_seconds=1)]
    assert first.extend(mine, claim_seconds=1) == set()  # held: renewed, nothing lost
    time.sleep(1.3)  # the first consumer "paused" past its claim; the second takes the messages over
    theirs = second.receive(10, claim_seconds=1)
    assert len(theirs) == 3
    if first.backend == "redis":  # ownership is exact there; moto accepts an old receipt until the message is gone
        assert first.extend(mine, claim_seconds=1) == set(mine)
        first.release(mine, after_seconds=0, claim_seconds=1)
        pending = first.client.xpending_range(first.name, "aggregator", "-", "+", 10)
        assert {(p["consumer"], p["time_since_delivered"] < 1000) for p in pending} == {(b"B", True)}  # untouched
    assert second.extend([d.receipt for d in theirs], claim_seconds=1) == set()
    second.ack([d.receipt for d in theirs])
    assert first.extend(mine, claim_seconds=1) == set(mine)  # answered and deleted by the second: lost
    assert first.stats().depth == 0


def test_an_sqs_collect_on_a_slow_endpoint_fills_its_group_with_every_claim_held(moto_url):
    config = queue_config("sqs", moto_url)
    producer, collector = open_queue(config), open_queue(config)
    try:
        for i in range(64):
            producer.send(f'{{"request_id": "r{i}", "prompt": "p"}}'.encode())
        # Every call to the endpoint takes 0.5 s: 7 receives (10 each) for a group of 64 take 3.5 s, far
        # past half of a 2 s claim, where the collect used to stop (at 20, or 10 when slower).
        collector.client.meta.events.register("before-send.sqs", lambda **_: time.sleep(0.5))
        collector.stats()  # the worker reads the depth before it collects: the first round trip measured
        got = collector.receive(64, claim_seconds=2)
        assert len({d.message_id for d in got}) == len(got) == 64
        assert producer.receive(10, claim_seconds=2) == []  # every claim still held when the collect returns
    finally:
        producer.delete()
        producer.close()
        collector.close()
