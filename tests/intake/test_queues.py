"""Both queue backends keep the same contract: claims, redelivery after a claim expires, batch acks, dead letters."""

from __future__ import annotations

import time

from airflow_batch_provider.intake.queues import open_queue


def test_send_receive_ack_empties_the_queue(queue):
    for i in range(25):  # over SQS's 10-per-call limits on receive and delete
        queue.send(f'{{"request_id": "r{i}", "prompt": "p"}}'.encode())
    assert queue.stats().depth == 25
    got = queue.receive(30, claim_seconds=60)
    assert len(got) == 25
    assert len({d.message_id for d in got}) == 25
    assert all(d.attempts == 1 and d.enqueued_at > time.time() - 60 for d in got)
    stats = queue.stats()
    assert (stats.depth, stats.waiting) == (25, 0)  # claimed, not yet acknowledged
    queue.ack([d.receipt for d in got])
    assert queue.stats().depth == 0
    assert queue.receive(10, claim_seconds=60) == []


def test_an_expired_claim_is_delivered_again(queue):
    queue.send(b'{"request_id": "a", "prompt": "p"}')
    first = queue.receive(10, claim_seconds=1)
    assert len(first) == 1
    assert queue.receive(10, claim_seconds=1) == []  # still claimed
    time.sleep(1.3)
    # Consumers of one queue share a claim length (GroupPolicy.claim_seconds): Redis applies it when
    # reclaiming (XAUTOCLAIM's min-idle-time), SQS when claiming (the visibility timeout).
    again = queue.receive(10, claim_seconds=1)
    assert [d.message_id for d in again] == [first[0].message_id]
    assert again[0].attempts == 2
    queue.ack([again[0].receipt])
    assert queue.stats().depth == 0


def test_dead_letter_keeps_the_body_and_reason(queue):
    queue.send(b"not json")
    (delivery,) = queue.receive(10, claim_seconds=60)
    queue.dead_letter(delivery, "not JSON (unexpected character)")
    assert queue.stats().depth == 0
    (dead,) = queue.dead_letters()
    assert dead["body"] == b"not json"
    assert dead["reason"] == "not JSON (unexpected character)"
    assert dead["message_id"] == delivery.message_id


def test_config_rebuilds_the_same_queue(queue):
    queue.send(b'{"request_id": "a", "prompt": "p"}')
    with open_queue(queue.config()) as other:
        assert other.stats().depth == 1
