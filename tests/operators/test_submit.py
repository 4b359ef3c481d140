"""SubmitBatchOperator: one batch per chunk, whatever retries and crashes happen in between."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.batches.submission import chunk_input_tokens, idempotency_key, submit_tagged
from airflow_batch_provider.batches.token_budget import (
    CHUNK_TOKENS_KEY,
    MODEL_KEY,
    BudgetCheck,
    budget_for,
    estimate_file_tokens,
    is_token_limit_refusal,
    refusal_step,
)
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.operators.submit import CHECKPOINT_KEY, SubmitBatchOperator
from airflow_batch_provider.status import BatchState, BatchStatus
from tests.conftest import wait_terminal
from tests.support import InMemoryTaskStateStore, make_context, write_chunk


def _chunk(tmp_path, n: int = 3):
    return write_chunk(tmp_path, [{"custom_id": f"s{i}", "text": f"t{i}"} for i in range(n)])


def _op(chunk) -> SubmitBatchOperator:
    return SubmitBatchOperator(task_id="submit", chunk=chunk)


def test_submit_records_intent_file_and_batch(openai_conn, tmp_path):
    store = InMemoryTaskStateStore()
    result = _op(_chunk(tmp_path)).execute(make_context(store))
    assert result["batch_id"] and result["input_file_id"]
    record = store.get(CHECKPOINT_KEY)
    assert record["batch_id"] == result["batch_id"]
    assert record["input_file_id"] == result["input_file_id"]
    # intent first, then the uploaded file, then the batch id
    keys_written = [set(value) for key, value in store.writes if key == CHECKPOINT_KEY]
    assert "batch_id" not in keys_written[0] and "input_file_id" not in keys_written[0]
    assert "input_file_id" in keys_written[1] and "batch_id" not in keys_written[1]
    assert "batch_id" in keys_written[-1]
    assert openai_conn.stats()["openai"]["batches_created"] == 1


def test_retry_reattaches_instead_of_resubmitting(openai_conn, tmp_path):
    store = InMemoryTaskStateStore()
    chunk = _chunk(tmp_path)
    first = _op(chunk).execute(make_context(store))
    second = _op(chunk).execute(make_context(store))  # a retry of the same task instance
    assert second["batch_id"] == first["batch_id"]
    stats = openai_conn.stats()["openai"]
    assert stats["batches_created"] == 1 and stats["files_uploaded"] == 1


def test_crash_after_create_before_checkpoint_finds_the_batch(openai_conn, tmp_path):
    """Intent recorded, batch created, batch id lost: the retry finds it through batch metadata."""
    store = InMemoryTaskStateStore()
    chunk = _chunk(tmp_path)
    first = _op(chunk).execute(make_context(store))
    record = store.get(CHECKPOINT_KEY)
    del record["batch_id"]  # what a SIGKILL between create and checkpoint leaves behind
    store.set(CHECKPOINT_KEY, record)
    second = _op(chunk).execute(make_context(store))
    assert second["batch_id"] == first["batch_id"]
    assert openai_conn.stats()["openai"]["batches_created"] == 1


def test_crash_after_upload_reuses_the_file(openai_conn, tmp_path):
    store = InMemoryTaskStateStore()
    chunk = _chunk(tmp_path)
    hook = OpenAIBatchHook()
    file_id = hook.upload_file(chunk["requests_path"])
    key = idempotency_key("test_dag", "run-1", "submit", 0, chunk["fingerprint"])
    store.set(CHECKPOINT_KEY, {"fingerprint": chunk["fingerprint"], "idempotency_key": key, "input_file_id": file_id})
    result = _op(chunk).execute(make_context(store))
    assert result["input_file_id"] == file_id
    stats = openai_conn.stats()["openai"]
    assert stats["files_uploaded"] == 1 and stats["batches_created"] == 1


def test_duplicates_found_on_reconcile_are_cancelled(openai_conn, tmp_path):
    openai_conn.set_faults(slow=30.0)
    chunk = _chunk(tmp_path)
    hook = OpenAIBatchHook()
    key = idempotency_key("test_dag", "run-1", "submit", 0, chunk["fingerprint"])
    file_id = hook.upload_file(chunk["requests_path"])
    a = hook.create_batch(chunk, input_file_id=file_id, metadata={"airflow_idempotency_key": key})
    b = hook.create_batch(chunk, input_file_id=file_id, metadata={"airflow_idempotency_key": key})
    store = InMemoryTaskStateStore()
    store.set(CHECKPOINT_KEY, {"fingerprint": chunk["fingerprint"], "idempotency_key": key})
    result = _op(chunk).execute(make_context(store))
    kept, other = (b, a) if result["batch_id"] == b else (a, b)
    assert result["batch_id"] == kept
    assert wait_terminal(hook, other).status.value == "cancelled"
    assert openai_conn.stats()["openai"]["batches_created"] == 2


def test_a_cancelled_batch_is_replaced_on_retry(openai_conn, tmp_path):
    openai_conn.set_faults(slow=30.0)
    store = InMemoryTaskStateStore()
    chunk = _chunk(tmp_path)
    first = _op(chunk).execute(make_context(store))
    hook = OpenAIBatchHook()
    hook.cancel(first["batch_id"])
    wait_terminal(hook, first["batch_id"])
    second = _op(chunk).execute(make_context(store))
    assert second["batch_id"] != first["batch_id"]
    assert second["input_file_id"] == first["input_file_id"]  # the upload is reused


def test_other_map_index_or_run_gets_its_own_batch(openai_conn, tmp_path):
    chunk = _chunk(tmp_path)
    a = _op(chunk).execute(make_context(InMemoryTaskStateStore(), run_id="2026-01-01"))
    b = _op(chunk).execute(make_context(InMemoryTaskStateStore(), run_id="2026-01-02"))
    assert a["batch_id"] != b["batch_id"]


def test_without_a_store_it_still_reconciles(openai_conn, tmp_path):
    chunk = _chunk(tmp_path)
    first = _op(chunk).execute(make_context(None))
    second = _op(chunk).execute(make_context(None))
    assert first["batch_id"] == second["batch_id"]
    assert openai_conn.stats()["openai"]["batches_created"] == 1


def test_map_index_template_names_the_chunk():
    op = SubmitBatchOperator(task_id="s", chunk={"label": "chunk 1/2"})
    assert op.map_index_template == "{{ task.chunk['label'] }}"


# ------------------------------------------------------------------------------- token budget


def test_openai_batches_record_their_estimated_tokens(openai_conn, tmp_path):
    chunk = _chunk(tmp_path, n=10)
    _op(chunk).execute(make_context(InMemoryTaskStateStore()))
    metadata = openai_conn.batches()[0]["metadata"]
    assert int(metadata[CHUNK_TOKENS_KEY]) == estimate_file_tokens(chunk["requests_path"], "gpt-4o-mini", "openai")
    assert metadata[MODEL_KEY] == "gpt-4o-mini"
    assert len(metadata) <= 16


def test_in_flight_tokens_count_live_batches_of_the_model(openai_conn, tmp_path):
    openai_conn.set_faults(slow=30.0)
    hook = OpenAIBatchHook()
    live = _op(_chunk(tmp_path / "a")).execute(make_context(InMemoryTaskStateStore()))
    done = _op(_chunk(tmp_path / "b", n=4)).execute(make_context(InMemoryTaskStateStore()))
    hook.cancel(done["batch_id"])
    wait_terminal(hook, done["batch_id"])
    tokens = int(openai_conn.batches()[0]["metadata"][CHUNK_TOKENS_KEY])
    assert hook.in_flight_tokens("gpt-4o-mini") == tokens  # the cancelled one no longer counts
    assert hook.in_flight_tokens("gpt-4.1") == 0
    hook.cancel(live["batch_id"])


@pytest.mark.parametrize("budget", [0, -5, True, "many", {"gpt-4o-mini": 0}, {}], ids=repr)
def test_a_bad_token_budget_is_refused_at_parse_time(budget):
    with pytest.raises(InvalidInputError, match="token_budget"):
        SubmitBatchOperator(task_id="s", chunk={"label": "c"}, token_budget=budget)


def test_budget_for_and_fits():
    assert budget_for(None, "m") is None
    assert budget_for(100, "m") == 100
    assert budget_for({"m": 5}, "m") == 5 and budget_for({"m": 5}, "other") is None
    assert BudgetCheck(tokens=60, in_flight=50, budget=100).fits is False
    assert BudgetCheck(tokens=50, in_flight=50, budget=100).fits is True
    assert BudgetCheck(tokens=500, in_flight=0, budget=100).fits is True  # alone it goes, or it would wait forever


def test_refusal_step_waits_then_resubmits_then_gives_up():
    wait: dict[str, float] = {}
    assert refusal_step(wait, now=100.0, interval=10, max_wait=60) == "wait"
    assert wait == {"since": 100.0, "resubmit_at": 110.0}
    assert refusal_step(wait, now=105.0, interval=10, max_wait=60) == "wait"
    assert refusal_step(wait, now=110.0, interval=10, max_wait=60) == "resubmit"
    assert refusal_step(wait, now=120.0, interval=10, max_wait=60) == "wait" and wait["resubmit_at"] == 130.0
    assert refusal_step(wait, now=161.0, interval=10, max_wait=60) == "give_up"


def test_only_a_pure_token_limit_failure_counts_as_a_refusal():
    def state(*codes: str) -> BatchState:
        errors = tuple({"code": c, "line": None, "message": "m", "param": None} for c in codes)
        return BatchState("b", "openai", BatchStatus.FAILED, "failed", errors=errors)

    assert is_token_limit_refusal(state("token_limit_exceeded"))
    assert not is_token_limit_refusal(state("token_limit_exceeded", "invalid_json_line"))
    assert not is_token_limit_refusal(state())


def test_token_estimate_falls_back_to_bytes(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b'{"custom_id": "a", "no_body": true}\n' * 4)
    assert estimate_file_tokens(str(path), "gpt-4o-mini", "openai") == -(-path.stat().st_size // 4)


def test_the_chunk_operators_token_estimate_is_used_without_reading_the_file(openai_conn, tmp_path, monkeypatch):
    chunk = {**_chunk(tmp_path, n=10), "estimated_input_tokens": 1234}

    def no_reading(*args, **kwargs):
        raise AssertionError("the requests file was read again for its tokens")

    monkeypatch.setattr("airflow_batch_provider.batches.submission.estimate_file_tokens", no_reading)
    _op(chunk).execute(make_context(InMemoryTaskStateStore()))
    assert openai_conn.batches()[0]["metadata"][CHUNK_TOKENS_KEY] == "1234"
    assert chunk_input_tokens(chunk) == 1234


def test_without_an_estimate_the_tokens_come_from_the_file(tmp_path):
    chunk = _chunk(tmp_path, n=10)
    expected = estimate_file_tokens(chunk["requests_path"], "gpt-4o-mini", "openai")
    assert chunk_input_tokens(chunk) == expected
    for unusable in (0, -3, True, "1234", None):
        assert chunk_input_tokens({**chunk, "estimated_input_tokens": unusable}) == expected


def test_a_follow_up_batch_counts_its_own_file_not_the_chunks_estimate(openai_conn, tmp_path):
    """submit_tagged sends a follow-up file smaller than the chunk its descriptor came from."""
    chunk = {**_chunk(tmp_path, n=10), "estimated_input_tokens": 10**6}
    submit_tagged(
        OpenAIBatchHook(),
        chunk,
        make_context(InMemoryTaskStateStore()),
        task_id="wait",
        dag_id="test_dag",
        tag="attempt-2",
        checkpoint_key="batch_wait.attempt-2",
        log=logging.getLogger(__name__),
    )
    tokens = int(openai_conn.batches()[0]["metadata"][CHUNK_TOKENS_KEY])
    assert tokens == estimate_file_tokens(chunk["requests_path"], "gpt-4o-mini", "openai") < 10**6


def test_an_orphans_create_that_lands_late_is_cancelled_after_the_rerun_creates(openai_conn, tmp_path, caplog, capsys):
    """The orphan (supervisor killed, task process alive) has its create in flight while the rerun
    reconciles, finds nothing and creates too; the orphan's lands first. The rerun checks again."""
    import threading

    # Both creates are held on the way in; batches then stay in progress (slow), as real ones do.
    openai_conn.set_faults(delay_routes={"POST /v1/batches": 1.5}, slow=60)
    store = InMemoryTaskStateStore()  # the task instance's state store, shared by both attempts
    chunk = _chunk(tmp_path)
    orphan: dict = {}
    thread = threading.Thread(target=lambda: orphan.update(_op(chunk).execute(make_context(store))))
    thread.start()
    wait_for = time.monotonic() + 10
    while openai_conn.stats()["http"].get("delayed", 0) < 1 and time.monotonic() < wait_for:
        time.sleep(0.02)  # the orphan's create is now held at the provider
    caplog.set_level(logging.WARNING)
    rerun = _op(chunk).execute(make_context(store))
    thread.join(timeout=30)
    assert orphan["batch_id"] != rerun["batch_id"]  # two batches were created for one chunk
    assert rerun["idempotency_key"] == orphan["idempotency_key"]
    states = {b: OpenAIBatchHook().get_state(b).status for b in (orphan["batch_id"], rerun["batch_id"])}
    assert states[orphan["batch_id"]] in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert states[rerun["batch_id"]] not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    logged = caplog.text + capsys.readouterr().out  # task logs reach stdout (structlog) or the capture
    assert f"cancelling batch {orphan['batch_id']}: it has the same idempotency key as batch {rerun['batch_id']}" in (
        logged
    )


def test_the_sensor_cancels_a_sibling_it_sees_first(openai_conn, openai_hook, tmp_path, caplog, capsys):
    """A late create can land after the submit's own check too: the first look of the wait cancels it.

    Deferred on OpenAI, that look is the trigger's first poll, answered by a list even while the
    batch waits alone: the sensor lists nothing itself (before, each sensor read the provider's list
    back through every batch created since its chunk's intent: 10 pages for the first chunks of a
    1,000-chunk job), and the trigger's ``siblings`` event wakes it to cancel, then it defers again.
    """
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_batch_provider.batches.submission import batch_metadata
    from airflow_batch_provider.sensors.batch import BatchCompleteSensor

    openai_conn.set_faults(slow=60)  # batches stay in progress, as real ones do
    store = InMemoryTaskStateStore()
    chunk = _chunk(tmp_path)
    submitted = _op(chunk).execute(make_context(store))
    key = submitted["idempotency_key"]
    file_id = openai_hook.upload_file(chunk["requests_path"])
    late = openai_hook.create_batch(
        chunk, input_file_id=file_id, metadata=batch_metadata({}, key, "test_dag", "run-1", "submit[0]", "late")
    )
    caplog.set_level(logging.WARNING)
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=True)
    context = make_context(InMemoryTaskStateStore())
    lists = openai_conn.stats()["routes"].get("GET /v1/batches", 0)
    with pytest.raises(TaskDeferred) as deferred:  # its batch is still running: it defers
        sensor.execute(context)
    assert openai_conn.stats()["routes"].get("GET /v1/batches", 0) == lists  # no look-up of its own
    trigger = deferred.value.trigger
    assert trigger.first_look and trigger.serialize()[1]["first_look"]

    async def events() -> list:
        return [event async for event in trigger.run()]

    (fired,) = asyncio.run(events())  # the trigger fires one event and ends
    event = fired.payload
    assert event["status"] == "siblings" and event["siblings"] == [late]
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=True)
    with pytest.raises(TaskDeferred) as again:  # cancelled the sibling, and waits on for its own batch
        sensor.execute_complete(context, event)
    assert not again.value.trigger.first_look
    # Still live (validating lasts one emulator latency, 0.05 s: either state may be seen here).
    assert openai_hook.get_state(submitted["batch_id"]).status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    assert openai_hook.get_state(late).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert f"cancelling batch {late}" in caplog.text + capsys.readouterr().out
