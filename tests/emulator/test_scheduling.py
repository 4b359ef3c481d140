"""The emulator's realtime slots honour request priority (vLLM's --scheduling-policy priority) or arrival (fcfs)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from airflow_batch_emulator import BatchEmulator
from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.scheduling import RealtimeScheduler


def _latency_of_urgent_request(policy: str) -> tuple[float, RealtimeScheduler]:
    """One slot busy with batch work (priority 10) and more queued; return how long a priority-0 request takes."""
    scheduler = RealtimeScheduler(slots=1, policy=policy)
    threads = [threading.Thread(target=scheduler.run, args=(10, 0.3)) for _ in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # arrival order: batch first
    started = time.monotonic()
    scheduler.run(0, 0.05)
    latency = time.monotonic() - started
    for thread in threads:
        thread.join()
    return latency, scheduler


def test_priority_serves_the_urgent_request_first_preempting_batch_work():
    latency, scheduler = _latency_of_urgent_request("priority")
    assert latency < 0.2  # its own 0.05 s, not the 0.9 s of batch work ahead of it
    assert scheduler.preemptions == 1
    assert scheduler.stats()["running"] == scheduler.stats()["waiting"] == 0


def test_fcfs_makes_the_urgent_request_wait_behind_batch_work():
    latency, scheduler = _latency_of_urgent_request("fcfs")
    assert latency > 0.8
    assert scheduler.preemptions == 0


def test_a_preempted_request_still_gets_all_its_service_time():
    scheduler = RealtimeScheduler(slots=1, policy="priority")
    done: list[float] = []
    started = time.monotonic()
    low = threading.Thread(target=lambda: (scheduler.run(10, 0.3), done.append(time.monotonic() - started)))
    low.start()
    time.sleep(0.1)
    scheduler.run(0, 0.2)
    low.join()
    assert done[0] >= 0.5  # 0.1 before preemption + 0.2 waiting + the remaining 0.2


def test_unlimited_slots_never_wait():
    scheduler = RealtimeScheduler()
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: scheduler.run(10, 0.1), range(8)))
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize(("policy", "fast"), [("priority", True), ("fcfs", False)])
def test_emulator_realtime_route_honours_the_priority_field(policy, fast):
    config = EmulatorConfig(realtime_slots=2, realtime_delay=0.2, scheduling_policy=policy)
    with BatchEmulator(config) as emulator, openai.OpenAI(api_key="k", base_url=emulator.openai_base_url) as client:

        def ask(priority: int | None) -> float:
            started = time.monotonic()
            extra = {"priority": priority} if priority is not None else None
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3, extra_body=extra
            )
            return time.monotonic() - started

        with ThreadPoolExecutor(9) as pool:
            batch = [pool.submit(ask, 10) for _ in range(8)]
            time.sleep(0.1)  # the batch requests hold both slots and fill the waiting line
            realtime = ask(None)
            assert all(f.result() >= 0.2 for f in batch)
        if fast:
            assert realtime < 0.35
            assert emulator.store.scheduler.preemptions >= 1
        else:
            assert realtime > 0.6  # behind 8 x 0.2 s of batch work on 2 slots
