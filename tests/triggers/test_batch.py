"""BatchCompleteTrigger driven directly (``[e async for e in trigger.run()]``) against the emulator."""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from typing import Any, ClassVar

from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.batches.line_retry import cancelled_by_us
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger
from tests.conftest import wait_terminal
from tests.support import write_chunk


async def _events(trigger: BatchCompleteTrigger) -> list:
    return [event async for event in trigger.run()]


def _trigger(batch_id: str, **kwargs) -> BatchCompleteTrigger:
    defaults = {"provider": "openai", "conn_id": "openai_batch_default", "batch_id": batch_id, "poll_interval": 0.05}
    return BatchCompleteTrigger(**{**defaults, **kwargs})


def test_serialize_round_trip():
    trigger = _trigger(
        "batch_1",
        timeout=90.0,
        max_poll_errors=3,
        cancel_on_kill=False,
        label="chunk 1/2",
        not_before=1.5e9,
        job_dir="/jobs/x",
        carry={"origin": "batch_1", "attempts": [{"batch_id": "batch_1"}]},
    )
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    assert path == "airflow_batch_provider.triggers.batch.BatchCompleteTrigger"


def test_runs_to_one_terminal_event(openai_hook, tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": f"t{i}", "text": "x"} for i in range(10)])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    events = asyncio.run(_events(_trigger(batch_id)))
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "success"
    assert payload["state"]["status"] == "completed"
    assert payload["state"]["output_file_id"]


def test_poll_error_streak_gives_an_error_event(openai_conn, openai_hook, tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": "p", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    wait_terminal(openai_hook, batch_id)
    openai_conn.set_faults(http_500_rate=1.0)
    events = asyncio.run(_events(_trigger(batch_id, max_poll_errors=3)))
    assert len(events) == 1
    assert events[0].payload["status"] == "error"
    assert "3 times in a row" in events[0].payload["message"]


def test_transient_poll_errors_are_tolerated(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=0.5, http_500_rate=0.3)
    chunk = write_chunk(tmp_path, [{"custom_id": "q", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    events = asyncio.run(_events(_trigger(batch_id, max_poll_errors=50)))
    assert [e.payload["status"] for e in events] == ["success"]


def test_timeout_event(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=30.0)
    chunk = write_chunk(tmp_path, [{"custom_id": "s", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    events = asyncio.run(_events(_trigger(batch_id, timeout=0.3)))
    assert [e.payload["status"] for e in events] == ["timeout"]
    openai_hook.cancel(batch_id)


def test_on_kill_cancels_the_batch(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=30.0)
    chunk = write_chunk(tmp_path, [{"custom_id": "k", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    asyncio.run(_trigger(batch_id).on_kill())
    assert wait_terminal(openai_hook, batch_id).status.value == "cancelled"


def test_on_kill_respects_cancel_on_kill_false(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=30.0)
    chunk = write_chunk(tmp_path, [{"custom_id": "k2", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    asyncio.run(_trigger(batch_id, cancel_on_kill=False).on_kill())
    assert openai_hook.get_state(batch_id).status.value in ("validating", "in_progress")
    openai_hook.cancel(batch_id)


def test_every_event_carries_the_sensor_record_back(openai_hook, tmp_path):
    batch_id = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "c", "text": "x"}]), metadata={})["batch_id"]
    carry = {"origin": batch_id, "attempts": [{"batch_id": batch_id}], "cancelled": {}}
    events = asyncio.run(_events(_trigger(batch_id, carry=carry)))
    assert events[0].payload["carry"] == carry


def test_not_before_delays_the_first_poll(openai_hook, tmp_path):
    batch_id = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "n", "text": "x"}]), metadata={})["batch_id"]
    wait_terminal(openai_hook, batch_id)
    started = time.monotonic()
    events = asyncio.run(_events(_trigger(batch_id, not_before=time.time() + 0.4)))
    assert time.monotonic() - started >= 0.35
    assert events[0].payload["status"] == "success"


def test_on_kill_leaves_a_we_cancelled_it_marker(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=30.0)
    batch_id = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "m", "text": "x"}]), metadata={})["batch_id"]
    asyncio.run(_trigger(batch_id, job_dir=str(tmp_path)).on_kill())
    assert cancelled_by_us(str(tmp_path), batch_id) == "its task was killed"
    assert wait_terminal(openai_hook, batch_id).status.value == "cancelled"


def _recording_hook(trigger: BatchCompleteTrigger, monkeypatch) -> list:
    """Record the async SDK clients that the trigger's polling hook opens."""
    hook = trigger.hook
    clients: list = []
    opened = hook.aget_client

    async def aget_client():
        client = await opened()
        clients.append(client)
        return client

    monkeypatch.setattr(hook, "aget_client", aget_client)
    return clients


def test_the_sdk_client_is_closed_in_the_triggers_own_loop(openai_hook, tmp_path, monkeypatch):
    """Left open, it is closed at garbage collection on another loop: "Event loop is closed" under dags test."""
    chunk = write_chunk(tmp_path, [{"custom_id": "c", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    trigger = _trigger(batch_id)
    clients = _recording_hook(trigger, monkeypatch)
    assert [e.payload["status"] for e in asyncio.run(_events(trigger))] == ["success"]
    assert clients and all(client.is_closed() for client in clients)


def test_the_client_is_closed_when_the_consumer_stops_at_the_event(openai_hook, tmp_path, monkeypatch):
    """A consumer that takes the one event and drops the generator (as a triggerer may) still closes it."""
    chunk = write_chunk(tmp_path, [{"custom_id": "d", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    trigger = _trigger(batch_id)
    clients = _recording_hook(trigger, monkeypatch)

    async def first_event():
        return await trigger.run().__anext__()

    assert asyncio.run(first_event()).payload["status"] == "success"
    assert clients and all(client.is_closed() for client in clients)


class ThreadRecordingHook(OpenAIBatchHook):
    """The real OpenAI hook, noting which thread built it and its async client (a backend added
    through the registry, as the README's 'Adding a backend' does)."""

    threads: ClassVar[dict[str, int]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ThreadRecordingHook.threads.setdefault("hook", threading.get_ident())
        super().__init__(*args, **kwargs)

    def _client_kwargs(self, conn: Any) -> dict[str, Any]:
        ThreadRecordingHook.threads.setdefault("client", threading.get_ident())
        return super()._client_kwargs(conn)


def test_run_and_on_kill_build_hooks_and_clients_off_the_event_loop(openai_hook, tmp_path, monkeypatch):
    """The triggerer's loop runs every deferred task: building a hook (its first use imports the SDK,
    ~0.3 s) or an SDK client (TLS trust store) on it stalls them all ("badly-written trigger")."""
    from airflow_batch_provider.hooks import registry

    monkeypatch.setitem(registry.LOCAL_RESULTS_HOOKS, "openai-recording", f"{__name__}:ThreadRecordingHook")
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    trigger = BatchCompleteTrigger(
        provider="openai-recording", conn_id="openai_batch_default", batch_id=batch_id, poll_interval=0.05
    )
    seen: dict[str, dict[str, int]] = {}

    async def run_then_kill() -> tuple[list, int]:
        ThreadRecordingHook.threads.clear()
        events = [event async for event in trigger.run()]
        seen["run"] = dict(ThreadRecordingHook.threads)
        ThreadRecordingHook.threads.clear()
        await trigger.on_kill()  # its own hook, with the full retry policy
        seen["on_kill"] = dict(ThreadRecordingHook.threads)
        return events, threading.get_ident()

    (event,), loop_thread = asyncio.run(run_then_kill())
    assert event.payload["status"] == "success"
    assert seen["run"].keys() == {"hook", "client"} and loop_thread not in seen["run"].values()
    assert "hook" in seen["on_kill"] and loop_thread not in seen["on_kill"].values()
