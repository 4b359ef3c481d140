"""GeminiBatchHook with the real google-genai SDK against the emulator's Gemini routes over HTTP."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from airflow_batch_provider.backends.gemini.hook import display_name
from airflow_batch_provider.batches.line_retry import scan_attempt
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.status import BatchStatus
from tests.backends.gemini.conftest import SCHEMA, gemini_chunk
from tests.conftest import wait_terminal


def _meta(key: str) -> dict[str, str]:
    return {IDEMPOTENCY_METADATA_KEY: key, "airflow_dag_id": "nightly"}


def _wait_status(hook, batch_id: str, status: BatchStatus, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = hook.get_state(batch_id)
        if state.status is status:
            return state
        time.sleep(0.05)
    raise AssertionError(f"{batch_id} never reached {status} (last: {state.provider_status})")


def test_create_wait_results(gemini_hook, gemini_conn, tmp_path):
    chunk = gemini_chunk(tmp_path, 30)
    submitted = gemini_hook.submit(chunk, metadata=_meta("k-create"))
    assert submitted["batch_id"].startswith("batches/")
    assert submitted["input_file_id"].startswith("files/")
    # The uploaded file holds the batch API's {"key", "request"} lines, not the chunk file's custom_id.
    uploaded = gemini_conn.gemini.files[submitted["input_file_id"]].data.splitlines()
    assert [orjson.loads(line)["key"] for line in uploaded] == [f"row-0-{i}" for i in range(30)]
    state = wait_terminal(gemini_hook, submitted["batch_id"])
    assert (state.status, state.provider_status) == (BatchStatus.COMPLETED, "JOB_STATE_SUCCEEDED")
    assert (state.counts.total, state.counts.completed, state.counts.failed) == (30, 30, 0)
    assert state.output_file_id and state.created_at and state.ended_at
    records = list(gemini_hook.iter_results(state))
    assert [r["custom_id"] for r in records] == [f"row-0-{i}" for i in range(30)]
    for record in records:
        assert record["status"] == "succeeded"
        answer = orjson.loads(record["response"])  # structured output: JSON of the schema
        assert answer["label"] in SCHEMA["properties"]["label"]["enum"]
        assert record["input_tokens"] > 0 and record["output_tokens"] > 0
    job = gemini_conn.gemini.runner.jobs[submitted["batch_id"]]
    assert job.display_name == display_name(_meta("k-create"), chunk["label"])
    assert job.model == "models/gemini-2.5-flash"


def test_find_existing_refinds_an_earlier_attempt_by_display_name(gemini_hook, gemini_conn, tmp_path):
    """A crash after create, before the batch id was checkpointed: the retry finds the batch by its name."""
    first = gemini_chunk(tmp_path, 3, index=0)
    other = gemini_chunk(tmp_path, 3, index=1)
    mine = gemini_hook.submit(first, metadata=_meta("key-mine"))["batch_id"]
    gemini_hook.submit(other, metadata=_meta("key-other"))
    assert gemini_hook.exact_reconcile
    found = gemini_hook.find_existing("key-mine", first, since=time.time() - 60)
    assert [s.batch_id for s in found] == [mine]
    assert found[0].counts.total == 3
    assert gemini_hook.find_existing("key-nobody", first) == []
    # "key-mine" must not match a display name that merely contains it.
    assert gemini_hook.find_existing("mine", first) == []


def test_find_existing_pages_through_the_listing(gemini_hook, gemini_conn, tmp_path):
    chunk = gemini_chunk(tmp_path, 1)
    wanted = gemini_hook.submit(chunk, metadata=_meta("key-early"))["batch_id"]
    file_id = gemini_hook.upload_file(chunk["requests_path"])
    for number in range(105):  # more than one page of 100, newest first: the wanted batch is on page 2
        gemini_hook.create_batch(chunk, input_file_id=file_id, metadata=_meta(f"filler-{number}"))
    assert [s.batch_id for s in gemini_hook.find_existing("key-early", chunk)] == [wanted]


def test_per_line_errors(gemini_hook, gemini_conn, tmp_path):
    gemini_conn.set_faults(invalid_line_rate=0.2, line_error_rate=0.2, truncate_rate=0.2, seed=7)
    submitted = gemini_hook.submit(gemini_chunk(tmp_path, 60), metadata=_meta("k-errors"))
    state = wait_terminal(gemini_hook, submitted["batch_id"])
    assert state.status is BatchStatus.COMPLETED
    records = list(gemini_hook.iter_results(state))
    by_code = {r["error_code"] for r in records if r["status"] == "errored"}
    assert by_code == {"INVALID_ARGUMENT", "INTERNAL"}
    assert {r["http_status"] for r in records if r["error_code"] == "INTERNAL"} == {500}
    assert any(r["finish_reason"] == "length" for r in records if r["status"] == "succeeded")
    failed = sum(r["status"] == "errored" for r in records)
    assert (state.counts.total, state.counts.failed, state.counts.completed) == (60, failed, 60 - failed)
    scan = scan_attempt(records, state=state, requested=lambda: [], all_results=lambda: records)
    internal = sorted(r["custom_id"] for r in records if r["error_code"] == "INTERNAL")
    assert sorted(scan.retry_ids) == internal  # server errors go again, invalid requests do not


def test_cancel(gemini_hook, gemini_conn, tmp_path):
    gemini_conn.set_faults(slow=30)
    submitted = gemini_hook.submit(gemini_chunk(tmp_path, 5), metadata=_meta("k-cancel"))
    _wait_status(gemini_hook, submitted["batch_id"], BatchStatus.IN_PROGRESS)
    gemini_hook.cancel(submitted["batch_id"])
    state = _wait_status(gemini_hook, submitted["batch_id"], BatchStatus.CANCELLED)
    assert state.provider_status == "JOB_STATE_CANCELLED"
    assert list(gemini_hook.iter_results(state)) == []  # nothing ran: no result file


def test_expired_batch_keeps_finished_lines_and_misses_the_rest(gemini_hook, gemini_conn, tmp_path):
    gemini_conn.set_faults(expire_rate=0.3, seed=3)
    chunk = gemini_chunk(tmp_path, 40)
    submitted = gemini_hook.submit(chunk, metadata=_meta("k-expire"))
    state = wait_terminal(gemini_hook, submitted["batch_id"])
    assert (state.status, state.provider_status) == (BatchStatus.EXPIRED, "JOB_STATE_EXPIRED")
    records = list(gemini_hook.iter_results(state))
    assert 0 < len(records) < 40 and all(r["status"] == "succeeded" for r in records)
    requested = [f"row-0-{i}" for i in range(40)]
    scan = scan_attempt(records, state=state, requested=lambda: requested, all_results=lambda: records)
    answered = {r["custom_id"] for r in records}
    assert sorted(scan.retry_ids) == sorted(set(requested) - answered)  # the missing lines go again


def test_failed_validation(gemini_hook, gemini_conn, tmp_path):
    gemini_conn.set_faults(fail_validation="invalid_input")
    submitted = gemini_hook.submit(gemini_chunk(tmp_path, 2), metadata=_meta("k-fail"))
    state = wait_terminal(gemini_hook, submitted["batch_id"])
    assert state.status is BatchStatus.FAILED
    assert "invalid_input" in state.errors[0]["message"]


def test_async_state_and_cancel(gemini_hook, gemini_conn, tmp_path):
    gemini_conn.set_faults(slow=30)
    batch_id = gemini_hook.submit(gemini_chunk(tmp_path, 2), metadata=_meta("k-async"))["batch_id"]

    async def run():
        try:
            first = await gemini_hook.aget_state(batch_id)
            cancelled = await gemini_hook.acancel(batch_id)
            for _ in range(100):
                if cancelled.status.is_terminal:
                    break
                await asyncio.sleep(0.05)
                cancelled = await gemini_hook.aget_state(batch_id)
            return first, cancelled
        finally:
            await gemini_hook.aclose()

    first, last = asyncio.run(run())
    assert first.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    assert last.status is BatchStatus.CANCELLED


def test_registry_console_link_and_missing_key(gemini_conn, monkeypatch, tmp_path):
    hook = get_batch_hook("gemini")
    assert hook.batch_url("batches/abc") is None  # the emulator is not Google's API: no console link
    monkeypatch.setenv("AIRFLOW_CONN_GEMINI_DEFAULT", '{"conn_type": "gemini", "password": "k"}')
    assert get_batch_hook("gemini").batch_url("batches/abc") == "https://aistudio.google.com/batches/abc"
    monkeypatch.setenv("AIRFLOW_CONN_GEMINI_DEFAULT", '{"conn_type": "gemini", "host": "http://127.0.0.1:1"}')
    with pytest.raises(Exception, match="no API key"):
        get_batch_hook("gemini").upload_file(gemini_chunk(tmp_path, 1)["requests_path"])


def test_http_faults_are_retried_without_losing_or_repeating_lines(gemini_hook, gemini_conn, tmp_path):
    gemini_conn.set_faults(http_429_rate=0.15, http_500_rate=0.1, drop_rate=0.05, retry_after=0.01, seed=11)
    submitted = gemini_hook.submit(gemini_chunk(tmp_path, 25), metadata=_meta("k-http"))
    state = wait_terminal(gemini_hook, submitted["batch_id"], timeout=60)
    records = list(gemini_hook.iter_results(state))
    assert sorted(r["custom_id"] for r in records) == sorted(f"row-0-{i}" for i in range(25))
    http = gemini_conn.stats()["http"]
    assert http["injected_429"] + http["injected_500"] + http["dropped"] >= 2  # the faults did happen
    assert len([b for b in gemini_conn.batches() if b["provider"] == "gemini"]) == 1  # one create, however retried


def test_display_name_fits_and_ends_in_the_key():
    key = "f" * 40
    name = display_name({IDEMPOTENCY_METADATA_KEY: key, "airflow_dag_id": "d" * 300}, "chunk 1/1 " + "x" * 300)
    assert len(name) <= 128 and name.endswith(f"[{key}]")


def test_a_create_whose_answer_is_lost_is_looked_up_not_sent_again(gemini_hook, gemini_conn, tmp_path):
    """The emulator makes the batch and answers 500: the hook finds it by its display name instead of resending."""
    chunk = gemini_chunk(tmp_path, 3)
    file_id = gemini_hook.upload_file(chunk["requests_path"])
    gemini_conn.set_faults(lose_answer_routes={"POST /v1beta/models/{model}:batchGenerateContent": 1}, slow=30.0)
    batch_id = gemini_hook.create_batch(chunk, input_file_id=file_id, metadata=_meta("key-lost"))
    assert list(gemini_conn.gemini.runner.jobs) == [batch_id]
    assert gemini_conn.stats()["http"]["answers_lost"] == 1


def test_a_lost_create_whose_batch_already_finished_is_adopted_not_sent_again(gemini_hook, gemini_conn, tmp_path):
    """Issue 38 item 14: the create's answer is lost and the batch ends before the hook looks: it is still the chunk's."""
    chunk = gemini_chunk(tmp_path, 2)
    file_id = gemini_hook.upload_file(chunk["requests_path"])
    route = "POST /v1beta/models/{model}:batchGenerateContent"
    gemini_conn.set_faults(lose_answer_routes={route: 1}, delay_after_routes={route: 2.0})  # it ends meanwhile
    batch_id = gemini_hook.create_batch(chunk, input_file_id=file_id, metadata=_meta("key-done"))
    assert list(gemini_conn.gemini.runner.jobs) == [batch_id]  # one batch: the create was not sent again
    assert gemini_conn.stats()["http"]["answers_lost"] == 1
    assert gemini_hook.get_state(batch_id).status is BatchStatus.COMPLETED


@pytest.mark.filterwarnings("ignore:BATCH_STATE_CANCELLING is not a valid JobState:UserWarning")  # the SDK's own
def test_a_cancel_under_way_is_cancelling_not_an_unknown_state(gemini_hook, gemini_conn, tmp_path, monkeypatch):
    """Issue 38 item 14: the wire's ``BATCH_STATE_CANCELLING`` (the SDK passes it through) means the cancel was taken."""
    gemini_conn.set_faults(slow=30)
    batch_id = gemini_hook.submit(gemini_chunk(tmp_path, 2), metadata=_meta("k-cancelling"))["batch_id"]
    _wait_status(gemini_hook, batch_id, BatchStatus.IN_PROGRESS)  # validated: nothing changes it for 30 s
    runner = gemini_conn.gemini.runner

    def cancel_slowly(job) -> None:  # as Google's API answers while a cancel is under way
        with runner.store.lock:
            job.set_state("BATCH_STATE_CANCELLING")

    monkeypatch.setattr(runner, "cancel", cancel_slowly)
    assert gemini_hook.cancel(batch_id).status is BatchStatus.CANCELLING

    async def acancel():
        try:
            return await gemini_hook.acancel(batch_id)
        finally:
            await gemini_hook.aclose()

    state = asyncio.run(acancel())
    assert (state.status, state.provider_status) == (BatchStatus.CANCELLING, "BATCH_STATE_CANCELLING")
