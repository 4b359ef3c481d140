"""BatchCompleteSensor: defer, poke, and the typed errors for batches that end badly."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_batch_provider.exceptions import (
    BatchCancelledError,
    BatchFailedError,
    BatchPollError,
    BatchTimeoutError,
)
from airflow_batch_provider.progress import PROGRESS_KEY, progress_base
from airflow_batch_provider.sensors.batch import BatchCompleteSensor
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger
from tests.conftest import wait_terminal
from tests.support import make_context, write_chunk


def _sensor(submitted, **kwargs) -> BatchCompleteSensor:
    return BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, **kwargs)


def test_defers_with_an_async_trigger_while_running(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=30.0)
    submitted = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    sensor = _sensor(submitted, deferrable=True)
    with pytest.raises(TaskDeferred) as info:
        sensor.execute(make_context())
    trigger = info.value.trigger
    assert isinstance(trigger, BatchCompleteTrigger)
    assert trigger.batch_id == submitted["batch_id"]
    assert info.value.method_name == "execute_complete"
    openai_hook.cancel(submitted["batch_id"])


def test_returns_at_once_when_already_done(openai_hook, tmp_path):
    submitted = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    wait_terminal(openai_hook, submitted["batch_id"])
    result = _sensor(submitted, deferrable=True).execute(make_context())
    assert result["batch_id"] == submitted["batch_id"]
    assert result["state"]["status"] == "completed"
    assert result["label"] == submitted["label"]


def test_poke_mode_when_not_deferrable(openai_hook, tmp_path):
    submitted = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    result = _sensor(submitted, deferrable=False).execute(make_context())
    assert result["state"]["status"] == "completed"


def test_each_look_at_the_batch_publishes_its_progress_for_the_view(openai_conn, openai_hook, tmp_path):
    """Poke mode publishes every poll; deferring hands the trigger the chunk's fixed progress fields."""
    openai_conn.set_faults(slow=1.0)
    rows = [{"custom_id": f"a{i}", "text": f"x{i}"} for i in range(50)]
    submitted = openai_hook.submit(write_chunk(tmp_path, rows), metadata={})
    context = make_context()
    _sensor(submitted, deferrable=False).execute(context)
    records = [value for key, value in context["ti"].pushed if key == PROGRESS_KEY]
    assert len(records) >= 2
    assert [r["completed"] for r in records] == sorted(r["completed"] for r in records)
    last = records[-1]
    assert (last["status"], last["completed"], last["total"]) == ("completed", 50, 50)
    assert last["batch_id"] == submitted["batch_id"] and last["chunk_index"] == 0 and last["label"]
    assert last["console_url"] is None  # the emulator is not the provider's own API host: no console
    assert last["created_at"] and last["ended_at"] >= last["created_at"]
    assert not any(key in last for key in ("body", "response", "messages"))

    openai_conn.set_faults(slow=30.0)
    again = openai_hook.submit(write_chunk(tmp_path / "b", rows[:1]), metadata={})
    with pytest.raises(TaskDeferred) as info:
        _sensor(again, deferrable=True).execute(make_context())
    assert info.value.trigger.progress == {**progress_base(again, 1)}
    openai_hook.cancel(again["batch_id"])


def test_validation_failure_raises_with_provider_codes(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(fail_validation=True)
    submitted = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    wait_terminal(openai_hook, submitted["batch_id"])
    with pytest.raises(BatchFailedError) as info:
        _sensor(submitted, deferrable=True).execute(make_context())
    assert submitted["batch_id"] in str(info.value)
    assert "chunk 1/1" in str(info.value)
    assert info.value.errors and info.value.errors[0]["code"]


def _state(status: BatchStatus, provider_status: str, *, completed: int = 4, code: str = "invalid_json_line") -> dict:
    return BatchState(
        batch_id="batch_1",
        provider="openai",
        status=status,
        provider_status=provider_status,
        counts=RequestCounts(total=10, completed=completed, failed=0),
        errors=({"code": code, "line": 3, "message": "bad line", "param": None},),
    ).to_dict()


@pytest.mark.parametrize(
    ("status", "provider_status", "error"),
    [
        (BatchStatus.FAILED, "failed", BatchFailedError),
        (BatchStatus.CANCELLED, "cancelled", BatchCancelledError),
    ],
    ids=["failed", "cancelled"],
)
def test_execute_complete_raises_typed_errors(status, provider_status, error):
    batch = {"batch_id": "batch_1", "provider": "openai", "label": "chunk 2/3 (10 req)"}
    sensor = _sensor(batch, deferrable=True)
    with pytest.raises(error) as info:
        sensor.execute_complete(make_context(), {"status": "success", "state": _state(status, provider_status)})
    assert "chunk 2/3" in str(info.value) and "batch_1" in str(info.value)
    assert info.value.state["status"] == status.value


def test_a_cancel_by_someone_else_says_so_and_is_not_retried():
    """A cancel is a decision: the error is an AirflowFailException, so Airflow does not burn the retries."""
    batch = {"batch_id": "batch_1", "provider": "openai", "label": "c"}
    with pytest.raises(BatchCancelledError, match="someone else, not by this pipeline") as info:
        _sensor(batch).execute_complete(
            make_context(), {"status": "success", "state": _state(BatchStatus.CANCELLED, "cancelled")}
        )
    assert isinstance(info.value, AirflowFailException)


def test_expiry_is_not_an_error_any_more():
    """An expired batch goes through the line-retry path (see tests/test_faults.py), it never raises as such."""
    batch = {"batch_id": "batch_1", "provider": "openai", "label": "c"}
    sensor = _sensor(batch, max_line_retries=0)
    out = sensor.execute_complete(
        make_context(), {"status": "success", "state": _state(BatchStatus.EXPIRED, "expired", code="x")}
    )
    assert out["state"]["status"] == "expired" and [a["status"] for a in out["attempts"]] == ["expired"]


def test_execute_complete_success_passes_the_state_on():
    batch = {"batch_id": "batch_1", "provider": "openai", "label": "c"}
    out = _sensor(batch).execute_complete(
        make_context(), {"status": "success", "state": _state(BatchStatus.COMPLETED, "completed", completed=10)}
    )
    assert out["state"]["status"] == "completed" and out["batch_id"] == "batch_1"
    assert out["attempts"] == [out["state"]]


def test_poll_error_event_raises():
    batch = {"batch_id": "batch_1", "provider": "openai", "label": "c"}
    with pytest.raises(BatchPollError, match="5 times"):
        _sensor(batch).execute_complete(make_context(), {"status": "error", "message": "failed 5 times in a row"})


def test_timeout_event_cancels_and_raises(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=30.0)
    submitted = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    with pytest.raises(BatchTimeoutError):
        _sensor(submitted).execute_complete(make_context(), {"status": "timeout", "message": "did not end"})
    assert wait_terminal(openai_hook, submitted["batch_id"]).status is BatchStatus.CANCELLED


@pytest.mark.parametrize(
    ("setting", "argument", "expected"),
    [
        (None, None, False),  # Airflow's own default: poke
        ("False", None, False),
        ("True", None, True),
        ("True", False, False),  # the task's argument wins over the deployment's setting
        ("False", True, True),
    ],
    ids=["airflow-default", "off", "on", "task-says-poke", "task-says-defer"],
)
def test_deferral_follows_airflows_default_deferrable_unless_the_task_says(monkeypatch, setting, argument, expected):
    if setting is None:
        monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    submitted = {"batch_id": "b", "provider": "openai", "chunk_index": 0, "label": "chunk 1/1"}
    kwargs = {} if argument is None else {"deferrable": argument}
    assert _sensor(submitted, **kwargs).deferrable is expected
