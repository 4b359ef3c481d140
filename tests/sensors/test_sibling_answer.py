"""The sensor's end-of-wait sibling check: free when the trigger's list named the siblings, else a list of its own.

Real OpenAI SDK over HTTP against the emulator, which counts every call per route
(``stats()["routes"]``): ``GET /v1/batches`` is the batch list.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_batch_provider.batches.submission import batch_metadata
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.sensors.batch import BatchCompleteSensor
from airflow_batch_provider.status import BatchStatus
from tests.conftest import wait_terminal
from tests.support import InMemoryTaskStateStore, make_context, write_chunk

LIST = "GET /v1/batches"


def _list_calls(emulator: Any) -> int:
    return int(emulator.stats()["routes"].get(LIST, 0))


def _deferred_with_a_late_sibling(openai_conn: Any, openai_hook: Any, tmp_path: Any, name: str) -> tuple[Any, ...]:
    """Submit a chunk, defer its sensor (first look: no sibling), then land a sibling and let the batch end."""
    openai_conn.set_faults(slow=1)  # the followed batch ends a second after it starts
    chunk = write_chunk(tmp_path / name, [{"custom_id": f"{name}{i}", "text": f"t{i}"} for i in range(3)])
    submitted = SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(InMemoryTaskStateStore()))
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=True)
    context = make_context(InMemoryTaskStateStore())
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    trigger = deferred.value.trigger
    assert trigger.idempotency_key == submitted["idempotency_key"]  # the trigger can name the key's siblings
    openai_conn.set_faults(slow=60)  # the late sibling stays in progress
    file_id = openai_hook.upload_file(chunk["requests_path"])
    metadata = batch_metadata({}, submitted["idempotency_key"], "test_dag", "run-1", "submit[0]", "late")
    late = openai_hook.create_batch(chunk, input_file_id=file_id, metadata=metadata)
    ended = wait_terminal(openai_hook, submitted["batch_id"])
    assert ended.status == BatchStatus.COMPLETED
    event = {"status": "success", "batch_id": ended.batch_id, "state": ended.to_dict(), "carry": trigger.carry}
    return sensor, context, submitted, late, event


def test_the_triggers_answer_cancels_the_sibling_without_a_list_call(
    openai_conn, openai_hook, tmp_path, caplog, capsys, monkeypatch
):
    counted: list[int] = []
    monkeypatch.setattr(BatchMetrics, "duplicates_cancelled", lambda self, count: counted.append(count))
    caplog.set_level(logging.WARNING)

    # The trigger's list named the sibling: execute_complete cancels it and lists nothing.
    sensor, context, submitted, late, event = _deferred_with_a_late_sibling(openai_conn, openai_hook, tmp_path, "a")
    counted.clear()
    lists = _list_calls(openai_conn)
    result = sensor.execute_complete(context, {**event, "siblings": [late]})
    assert _list_calls(openai_conn) == lists  # no batch-list call at all
    assert result["batch_id"] == submitted["batch_id"] and result["state"]["status"] == "completed"
    assert openai_hook.get_state(late).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert f"cancelling batch {late}: it has the same idempotency key as batch {submitted['batch_id']}" in (
        caplog.text + capsys.readouterr().out
    )
    assert sum(counted) == 1  # llm_batch.duplicate_batches_cancelled

    # An empty answer: nothing to cancel, and still no list call.
    sensor, context, submitted, late, event = _deferred_with_a_late_sibling(openai_conn, openai_hook, tmp_path, "b")
    lists = _list_calls(openai_conn)
    sensor.execute_complete(context, {**event, "siblings": []})
    assert _list_calls(openai_conn) == lists
    assert openai_hook.get_state(late).status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)  # none touched
    openai_hook.cancel(late)

    # No answer (the trigger's batch was retrieved on its own): the sensor lists, as before, and cancels
    # (an orphan's create can be in flight for minutes, so it can land while the sensor is deferred).
    sensor, context, submitted, late, event = _deferred_with_a_late_sibling(openai_conn, openai_hook, tmp_path, "c")
    counted.clear()
    lists = _list_calls(openai_conn)
    result = sensor.execute_complete(context, event)
    assert _list_calls(openai_conn) > lists
    assert result["batch_id"] == submitted["batch_id"] and result["state"]["status"] == "completed"
    assert openai_hook.get_state(late).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert f"cancelling batch {late}: it has the same idempotency key as batch {submitted['batch_id']}" in (
        caplog.text + capsys.readouterr().out
    )
    assert sum(counted) == 1


def test_a_named_sibling_that_already_ended_is_not_cancelled(openai_conn, openai_hook, tmp_path, monkeypatch):
    """The list is a few seconds old: a named batch that has ended since is left alone, as the listing check does."""
    counted: list[int] = []
    monkeypatch.setattr(BatchMetrics, "duplicates_cancelled", lambda self, count: counted.append(count))
    sensor, context, _, late, event = _deferred_with_a_late_sibling(openai_conn, openai_hook, tmp_path, "a")
    openai_hook.cancel(late)
    wait_terminal(openai_hook, late)
    counted.clear()
    lists = _list_calls(openai_conn)
    sensor.execute_complete(context, {**event, "siblings": [late]})
    assert _list_calls(openai_conn) == lists and sum(counted) == 0


def _deferred_while_a_sibling_lands(openai_conn: Any, openai_hook: Any, tmp_path: Any, name: str) -> tuple[Any, ...]:
    """Submit a chunk that stays in progress, defer its sensor, then land a live sibling (a late create).

    Returns the submitted descriptor, the sensor's context, the first trigger, the sibling's id, and
    a mid-wait ``siblings`` event for the submitted batch without names (the caller adds them).
    """
    openai_conn.set_faults(slow=60)
    chunk = write_chunk(tmp_path / name, [{"custom_id": f"{name}{i}", "text": f"t{i}"} for i in range(3)])
    submitted = SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(InMemoryTaskStateStore()))
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=True)
    context = make_context(InMemoryTaskStateStore())
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    file_id = openai_hook.upload_file(chunk["requests_path"])
    metadata = batch_metadata({}, submitted["idempotency_key"], "test_dag", "run-1", "submit[0]", "late")
    late = openai_hook.create_batch(chunk, input_file_id=file_id, metadata=metadata)
    live = openai_hook.get_state(submitted["batch_id"]).to_dict()
    trigger = deferred.value.trigger
    event = {"status": "siblings", "batch_id": live["batch_id"], "state": live, "carry": trigger.carry}
    return submitted, context, trigger, late, event


def test_a_look_the_trigger_could_not_make_is_made_by_the_sensor(openai_conn, openai_hook, tmp_path):
    """No list answered the trigger's first poll (it failed, or did not reach back to the batch): the
    trigger fires ``siblings`` with None, and the sensor lists on its own, cancels, and defers again."""
    submitted, context, _, late, event = _deferred_while_a_sibling_lands(openai_conn, openai_hook, tmp_path, "n")
    lists = _list_calls(openai_conn)
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=True)
    with pytest.raises(TaskDeferred) as again:
        sensor.execute_complete(context, {**event, "siblings": None})
    assert _list_calls(openai_conn) > lists
    assert openai_hook.get_state(late).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert again.value.trigger.batch_id == submitted["batch_id"] and not again.value.trigger.first_look
    openai_hook.cancel(submitted["batch_id"])


def test_the_next_trigger_knows_the_siblings_already_cancelled(openai_conn, openai_hook, tmp_path):
    """A ``siblings`` event mid-wait: the sensor cancels the named batch and defers again with it known,
    so a sibling the provider is slow to cancel does not wake the sensor at every poll."""
    submitted, context, first, late, event = _deferred_while_a_sibling_lands(openai_conn, openai_hook, tmp_path, "k")
    assert first.known_siblings == []
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=True)
    with pytest.raises(TaskDeferred) as again:
        sensor.execute_complete(context, {**event, "siblings": [late]})
    assert openai_hook.get_state(late).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert again.value.trigger.known_siblings == [late]
    openai_hook.cancel(submitted["batch_id"])
