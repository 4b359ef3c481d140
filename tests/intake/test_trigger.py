"""QueueGroupTrigger fires once a group is ready, and only awaits: the event loop keeps ticking meanwhile."""

from __future__ import annotations

import asyncio
import time

import orjson

from airflow_batch_provider.intake.aggregator import GroupPolicy
from airflow_batch_provider.triggers.intake import QueueGroupTrigger


async def test_fires_after_max_wait_without_blocking_the_loop(queue):
    policy = GroupPolicy(max_items=50, max_wait=1.0, claim_seconds=60)
    trigger = QueueGroupTrigger(queue=queue.config(), policy=policy.to_dict(), poll_interval=0.1)
    assert QueueGroupTrigger(**trigger.serialize()[1]).serialize() == trigger.serialize()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    queued_at = time.monotonic()  # the group's clock starts when its first item is enqueued, not after the sends
    for i in range(3):
        queue.send(orjson.dumps({"request_id": f"r{i}", "prompt": "p"}))
    started = time.monotonic()
    tick_task = asyncio.create_task(ticker())
    events = [event async for event in trigger.run()]
    elapsed = time.monotonic() - started
    tick_task.cancel()
    assert [e.payload["status"] for e in events] == ["ready"]
    assert events[0].payload["waiting"] == 3
    assert 0.9 <= elapsed + (started - queued_at) < 5
    assert ticks > elapsed / 0.01 * 0.5  # the loop was free while the trigger waited


async def test_fires_at_once_when_a_full_group_waits(queue):
    for i in range(5):
        queue.send(orjson.dumps({"request_id": f"r{i}", "prompt": "p"}))
    policy = GroupPolicy(max_items=5, max_wait=3600, claim_seconds=60)
    trigger = QueueGroupTrigger(queue=queue.config(), policy=policy.to_dict(), poll_interval=0.1, timeout=10)
    events = [event async for event in trigger.run()]
    assert events[0].payload == {"status": "ready", "depth": 5, "waiting": 5}


async def test_times_out_on_an_empty_queue(queue):
    policy = GroupPolicy(max_items=5, max_wait=0, claim_seconds=60)
    trigger = QueueGroupTrigger(queue=queue.config(), policy=policy.to_dict(), poll_interval=0.05, timeout=0.3)
    events = [event async for event in trigger.run()]
    assert [e.payload["status"] for e in events] == ["timeout"]
