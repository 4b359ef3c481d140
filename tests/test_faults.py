"""The fault table (docs/faults.md), one test per row: real SDKs against the emulator.

Each test runs the real operators — SubmitBatchOperator, BatchCompleteSensor (execute, then its
trigger's ``run()``, then ``execute_complete``, each step on a fresh operator instance as Airflow
does), MergeResultsOperator — and checks the merged output (every input row exactly once, the
right status and ``attempts``) and what was or was not resent (``batches(include_custom_ids=True)``).

The emulator decides line faults per custom_id and snapshots the fault settings when a batch is
created, so "a transient failure" is staged by switching faults off after the first batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx2
import openai
import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_batch_emulator.faults import Faults, line_fate
from airflow_batch_provider.backends.anthropic.hook import AnthropicBatchHook
from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.batches.line_retry import cancelled_by_us
from airflow_batch_provider.exceptions import (
    BatchCancelledError,
    BatchFailedError,
    BatchTimeoutError,
    TooManyFailuresError,
)
from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.sensors.batch import CHECKPOINT_KEY, BatchCompleteSensor
from airflow_batch_provider.status import BatchStatus
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.conftest import wait_terminal
from tests.support import InMemoryTaskStateStore, make_context, write_chunk

ANTHROPIC_MODEL = "claude-haiku-5-5"


# ------------------------------------------------------------------------------------------ helpers


def _rows(n: int, prefix: str = "p") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}{i:04d}", "text": f"product number {i}", "sku": i} for i in range(n)]


def _chunk(tmp_path, rows, provider: str = "openai", index: int = 0, num_chunks: int = 1) -> dict[str, Any]:
    if provider == "openai":
        return write_chunk(tmp_path / "job", rows, index=index, num_chunks=num_chunks)
    lines = [
        {
            "custom_id": r["custom_id"],
            "params": {
                "model": ANTHROPIC_MODEL,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": r["text"]}],
            },
        }
        for r in rows
    ]
    chunk = write_chunk(tmp_path / "job", rows, index=index, num_chunks=num_chunks, lines=lines, model=ANTHROPIC_MODEL)
    return {**chunk, "provider": "anthropic", "endpoint": "/v1/messages"}


def _submit(chunk, store=None, **kwargs) -> dict[str, Any]:
    op = SubmitBatchOperator(task_id="submit", chunk=chunk, **kwargs)
    return op.execute(make_context(store or InMemoryTaskStateStore()))


async def _events(trigger) -> list:
    return [event async for event in trigger.run()]


class SensorRun:
    """Drive BatchCompleteSensor as Airflow does: execute, run the trigger, resume on a fresh instance."""

    def __init__(self, batch: dict[str, Any], store: InMemoryTaskStateStore | None = None, **kwargs: Any) -> None:
        self.batch = batch
        self.store = store if store is not None else InMemoryTaskStateStore()
        self.kwargs = {"poll_interval": 0.05, **kwargs}
        self.deferrals = 0

    def sensor(self) -> BatchCompleteSensor:
        return BatchCompleteSensor(task_id="wait", batch=self.batch, **self.kwargs)

    def run(self, max_deferrals: int = 30) -> dict[str, Any]:
        context = make_context(self.store)
        try:
            return self.sensor().execute(context)
        except TaskDeferred as deferred:
            current = deferred
        for _ in range(max_deferrals):
            self.deferrals += 1
            events = asyncio.run(_events(current.trigger))
            assert len(events) == 1, events
            try:
                return getattr(self.sensor(), current.method_name)(context, events[0].payload)
            except TaskDeferred as again:
                current = again
        raise AssertionError(f"still deferred after {max_deferrals} trigger runs")


def _merge(tmp_path, completed: list[dict[str, Any]], **kwargs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = tmp_path / "out"
    summary = MergeResultsOperator(task_id="merge", batches=completed, output_dir=str(out), **kwargs).execute(
        make_context()
    )
    return summary, pq.read_table(out).to_pylist()


def _read(tmp_path) -> list[dict[str, Any]]:
    return pq.read_table(tmp_path / "out").to_pylist()


def _fates(rows, batch_id: str, **faults: Any) -> dict[str, str]:
    """What the emulator does to each row in batch ``batch_id`` (transient faults roll per batch)."""
    settings = Faults(**faults)
    return {r["custom_id"]: line_fate(settings, r["custom_id"], batch_id) for r in rows}


def _sent(emulator) -> list[list[str]]:
    """The custom_ids of every batch the emulator received, oldest first."""
    return [b["custom_ids"] for b in emulator.batches(include_custom_ids=True)]


def _assert_every_row_once(merged, rows) -> None:
    assert [m["custom_id"] for m in merged] == [r["custom_id"] for r in rows]
    assert [m["sku"] for m in merged] == [r["sku"] for r in rows]


# ----------------------------------------------------------------------------- line-level faults


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_line_errors_are_resent_once_and_recover(batch_emulator, openai_conn, anthropic_conn, provider, tmp_path):
    """--line-error-rate (transient): only the failed lines go out again; the rerun answers them."""
    rows = _rows(60)
    faults = {"line_error_rate": 0.2, "seed": 1}
    batch_emulator.set_faults(**faults)
    submitted = _submit(_chunk(tmp_path, rows, provider))
    failing = [cid for cid, fate in _fates(rows, submitted["batch_id"], **faults).items() if fate == "server_error"]
    assert 3 <= len(failing) <= 25
    hook = OpenAIBatchHook() if provider == "openai" else AnthropicBatchHook()
    wait_terminal(hook, submitted["batch_id"])
    batch_emulator.set_faults()  # the follow-up meets a healthy provider

    run = SensorRun(submitted)
    completed = run.run()
    assert run.deferrals >= 1  # it deferred on the follow-up batch
    assert [a["status"] for a in completed["attempts"]] == ["completed", "completed"]
    assert completed["state"] == completed["attempts"][0]
    assert _sent(batch_emulator) == [[r["custom_id"] for r in rows], failing]  # only the failed lines, in order

    summary, merged = _merge(tmp_path, [completed])
    _assert_every_row_once(merged, rows)
    assert {m["status"] for m in merged} == {"succeeded"}
    second = completed["attempts"][1]["batch_id"]
    for m in merged:
        assert m["attempts"] == (2 if m["custom_id"] in failing else 1)
        assert m["batch_id"] == (second if m["custom_id"] in failing else submitted["batch_id"])
    assert summary["retried_rows"] == summary["recovered_rows"] == len(failing)
    # The summary's request counts are what the provider processed: first sends plus line retries.
    assert (summary["batches"], summary["requests_sent"], summary["requests_resent"]) == (2, 60, len(failing))
    assert batch_emulator.stats()[provider]["requests_processed"] == 60 + len(failing)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_line_errors_that_persist_use_every_retry_then_merge_judges(
    batch_emulator, openai_conn, anthropic_conn, provider, tmp_path
):
    """--line-error-rate 1.0 (an outage that outlasts the retries): max_line_retries follow-ups, then errors."""
    rows = _rows(40)
    faults = {"line_error_rate": 1.0, "seed": 1}
    failing = [r["custom_id"] for r in rows]
    batch_emulator.set_faults(**faults)
    completed = SensorRun(_submit(_chunk(tmp_path, rows, provider))).run()
    assert len(completed["attempts"]) == 3  # 1 + max_line_retries (2)
    assert _sent(batch_emulator) == [[r["custom_id"] for r in rows], failing, failing]

    with pytest.raises(TooManyFailuresError) as info:
        _merge(tmp_path, [completed])  # default max_failure_ratio 0.05 < len(failing) / 40
    assert f"{len(failing)} of 40 rows failed" in str(info.value)
    assert ("server_error" if provider == "openai" else "api_error") in str(info.value)
    summary = info.value.summary
    assert (summary["batches"], summary["requests_sent"], summary["requests_resent"]) == (3, 40, 80)
    assert (summary["retried_rows"], summary["recovered_rows"]) == (40, 0)
    merged = _read(tmp_path)  # written before the error
    _assert_every_row_once(merged, rows)
    for m in merged:
        if m["custom_id"] in failing:
            assert (m["status"], m["attempts"]) == ("errored", 3) and m["error"]
            assert m["batch_id"] == completed["attempts"][2]["batch_id"]
        else:
            assert (m["status"], m["attempts"]) == ("succeeded", 1)


def test_invalid_lines_are_not_resent(batch_emulator, openai_conn, tmp_path):
    """--invalid-line-rate: 400-class lines are final; nothing is resent; merge names the chunk and error."""
    rows = _rows(40)
    faults = {"invalid_line_rate": 0.25, "seed": 4}
    invalid = {cid for cid, fate in _fates(rows, "any-batch", **faults).items() if fate == "invalid"}
    batch_emulator.set_faults(**faults)
    completed = SensorRun(_submit(_chunk(tmp_path, rows))).run()
    assert len(completed["attempts"]) == 1
    assert batch_emulator.stats()["openai"]["batches_created"] == 1

    with pytest.raises(TooManyFailuresError) as info:
        _merge(tmp_path, [completed])
    assert "chunk 1/1" in str(info.value) and "invalid_request_error" in str(info.value)
    merged = _read(tmp_path)
    _assert_every_row_once(merged, rows)
    assert {m["custom_id"] for m in merged if m["status"] == "errored"} == invalid
    assert {m["attempts"] for m in merged} == {1}
    summary, _ = _merge(tmp_path, [completed], max_failure_ratio=None)
    assert summary["failed"] == len(invalid) and summary["top_errors"][0][1] == len(invalid)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_expired_lines_keep_what_finished_and_resend_the_rest(
    batch_emulator, openai_conn, anthropic_conn, provider, tmp_path
):
    """--expire-rate: the batch ends expired, finished lines are kept, expired ones go through the retry path."""
    rows = _rows(50)
    faults = {"expire_rate": 0.2, "seed": 5}
    batch_emulator.set_faults(**faults)
    submitted = _submit(_chunk(tmp_path, rows, provider))
    expired = [cid for cid, fate in _fates(rows, submitted["batch_id"], **faults).items() if fate == "expired"]
    assert expired
    hook = OpenAIBatchHook() if provider == "openai" else AnthropicBatchHook()
    assert wait_terminal(hook, submitted["batch_id"]).status is BatchStatus.EXPIRED
    batch_emulator.set_faults()

    completed = SensorRun(submitted).run()  # no BatchExpiredError any more
    assert [a["status"] for a in completed["attempts"]] == ["expired", "completed"]
    assert _sent(batch_emulator)[1] == expired
    _, merged = _merge(tmp_path, [completed])
    _assert_every_row_once(merged, rows)
    assert {m["status"] for m in merged} == {"succeeded"}
    assert {m["custom_id"] for m in merged if m["attempts"] == 2} == set(expired)


def test_expired_lines_without_retries_are_judged_by_the_merge(batch_emulator, openai_conn, tmp_path):
    """max_line_retries=0: expiry still does not raise in the sensor; merge keeps finished rows."""
    rows = _rows(40)
    faults = {"expire_rate": 0.1, "seed": 6}
    batch_emulator.set_faults(**faults)
    submitted = _submit(_chunk(tmp_path, rows))
    expired = {cid for cid, fate in _fates(rows, submitted["batch_id"], **faults).items() if fate == "expired"}
    completed = SensorRun(submitted, max_line_retries=0).run()
    assert [a["status"] for a in completed["attempts"]] == ["expired"]
    summary, merged = _merge(tmp_path, [completed], max_failure_ratio=0.5)
    assert {m["custom_id"] for m in merged if m["status"] == "expired"} == expired
    assert all(m["error"] for m in merged if m["status"] == "expired")
    assert summary["succeeded"] == 40 - len(expired)


# ------------------------------------------------------------------------------- batch-level faults


def test_failed_validation_raises_with_the_provider_codes(batch_emulator, openai_conn, tmp_path):
    """--fail-validation CODE: BatchFailedError carrying the code; nothing resent."""
    batch_emulator.set_faults(fail_validation="duplicate_custom_id")
    submitted = _submit(_chunk(tmp_path, _rows(5)))
    with pytest.raises(BatchFailedError, match="duplicate_custom_id") as info:
        SensorRun(submitted).run()
    assert info.value.errors[0]["code"] == "duplicate_custom_id" and "chunk 1/1" in str(info.value)
    assert batch_emulator.stats()["openai"]["batches_created"] == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_cancel_by_someone_else_fails_the_task(batch_emulator, openai_conn, anthropic_conn, provider, tmp_path):
    """--cancel-batches: the provider (not us) cancels; BatchCancelledError, not success, nothing resent."""
    batch_emulator.set_faults(cancel_batches=True, slow=0.3)
    submitted = _submit(_chunk(tmp_path, _rows(20), provider))
    with pytest.raises(BatchCancelledError, match="someone else, not by this pipeline"):
        SensorRun(submitted).run()
    assert batch_emulator.stats()[provider]["batches_created"] == 1


def test_killing_the_deferred_task_cancels_the_batch_and_a_rerun_sends_it_again(batch_emulator, openai_conn, tmp_path):
    """Trigger on_kill: the batch is cancelled and marked as ours; clearing the task resubmits its lines."""
    batch_emulator.set_faults(slow=30.0)
    rows = _rows(5)
    submitted = _submit(_chunk(tmp_path, rows))
    run = SensorRun(submitted)
    with pytest.raises(TaskDeferred) as info:
        run.sensor().execute(make_context(run.store))
    asyncio.run(info.value.trigger.on_kill())
    assert wait_terminal(OpenAIBatchHook(), submitted["batch_id"]).status is BatchStatus.CANCELLED
    assert cancelled_by_us(submitted["job_dir"], submitted["batch_id"]) == "its task was killed"

    batch_emulator.set_faults()
    completed = run.run()  # the task cleared and run again
    assert completed["batch_id"] != submitted["batch_id"]
    assert run.store.get(CHECKPOINT_KEY)["attempts"][0]["replaced"] == [submitted["batch_id"]]
    assert _sent(batch_emulator) == [[r["custom_id"] for r in rows]] * 2
    _, merged = _merge(tmp_path, [completed])
    _assert_every_row_once(merged, rows)
    assert {(m["status"], m["attempts"]) for m in merged} == {("succeeded", 1)}


def test_killing_a_poking_task_cancels_the_batch(batch_emulator, openai_conn, tmp_path):
    """Sensor on_kill (deferrable=False): cancel, recorded in the task state store; that run fails."""
    batch_emulator.set_faults(slow=30.0)
    submitted = _submit(_chunk(tmp_path, _rows(5)))
    store = InMemoryTaskStateStore()
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=False)
    outcome: list[BaseException] = []

    def poke() -> None:
        try:
            sensor.execute(make_context(store))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=poke)
    thread.start()
    time.sleep(0.5)
    sensor.on_kill()  # what Airflow calls when the task is killed
    thread.join(timeout=30)
    assert store.get(CHECKPOINT_KEY)["cancelled"] == {submitted["batch_id"]: "its task was killed"}
    assert isinstance(outcome[0], BatchCancelledError) and "cancelled by this task" in str(outcome[0])
    assert batch_emulator.stats()["openai"]["batches_created"] == 1


def test_a_timeout_cancels_the_batch_and_the_retry_sends_it_again(batch_emulator, openai_conn, tmp_path):
    """Trigger timeout event: cancel (recorded), BatchTimeoutError; Airflow's retry resubmits the lines."""
    batch_emulator.set_faults(slow=30.0)
    submitted = _submit(_chunk(tmp_path, _rows(5)))
    store = InMemoryTaskStateStore()
    with pytest.raises(BatchTimeoutError):
        SensorRun(submitted, store, timeout=0.3).run()
    assert wait_terminal(OpenAIBatchHook(), submitted["batch_id"]).status is BatchStatus.CANCELLED
    assert store.get(CHECKPOINT_KEY)["cancelled"] == {submitted["batch_id"]: "the sensor timed out"}
    batch_emulator.set_faults()
    completed = SensorRun(submitted, store).run()
    assert completed["state"]["status"] == "completed" and completed["batch_id"] != submitted["batch_id"]


def test_a_poke_mode_timeout_cancels_the_batch(batch_emulator, openai_conn, tmp_path):
    batch_emulator.set_faults(slow=30.0)
    submitted = _submit(_chunk(tmp_path, _rows(5)))
    with pytest.raises(BatchTimeoutError):
        SensorRun(submitted, deferrable=False, timeout=0.3).run()
    assert wait_terminal(OpenAIBatchHook(), submitted["batch_id"]).status is BatchStatus.CANCELLED


def test_cancel_on_kill_false_leaves_the_batch_alone(batch_emulator, openai_conn, tmp_path):
    batch_emulator.set_faults(slow=30.0)
    submitted = _submit(_chunk(tmp_path, _rows(5)))
    with pytest.raises(BatchTimeoutError):
        SensorRun(submitted, timeout=0.3, cancel_on_kill=False).run()
    assert OpenAIBatchHook().get_state(submitted["batch_id"]).status is BatchStatus.IN_PROGRESS
    OpenAIBatchHook().cancel(submitted["batch_id"])


def test_a_retried_sensor_reattaches_to_its_follow_up(batch_emulator, openai_conn, tmp_path):
    """Crash after the follow-up was created (even before its id was recorded): no third batch."""
    rows = _rows(30)
    batch_emulator.set_faults(line_error_rate=0.3, seed=7)
    submitted = _submit(_chunk(tmp_path, rows))
    wait_terminal(OpenAIBatchHook(), submitted["batch_id"])
    batch_emulator.set_faults(slow=1.0)
    run = SensorRun(submitted)
    with pytest.raises(TaskDeferred) as first:
        run.sensor().execute(make_context(run.store))
    followup = first.value.trigger.batch_id
    # what a SIGKILL between "follow-up created" and "its id checkpointed" leaves behind
    record = run.store.get(CHECKPOINT_KEY)
    record["attempts"].pop()
    run.store.set(CHECKPOINT_KEY, record)
    step = run.store.get(f"{CHECKPOINT_KEY}.attempt-2")
    del step["batch_id"]
    run.store.set(f"{CHECKPOINT_KEY}.attempt-2", step)

    with pytest.raises(TaskDeferred) as again:  # the task's retry
        run.sensor().execute(make_context(run.store))
    assert again.value.trigger.batch_id == followup
    completed = run.run()
    assert [a["batch_id"] for a in completed["attempts"]] == [submitted["batch_id"], followup]
    assert batch_emulator.stats()["openai"]["batches_created"] == 2


# ---------------------------------------------------------------------------------- token limit


def test_a_token_limit_refusal_is_waited_out_and_resubmitted(batch_emulator, openai_conn, tmp_path):
    """--token-limit: the provider refuses while another batch is in flight; wait, resubmit, succeed."""
    first_rows, second_rows = _rows(20, "a"), _rows(20, "b")
    batch_emulator.set_faults(token_limit=200, slow=2.0)  # 140 emulator tokens per chunk: two do not fit
    first = _submit(_chunk(tmp_path / "one", first_rows))
    while OpenAIBatchHook().get_state(first["batch_id"]).status is BatchStatus.VALIDATING:
        time.sleep(0.05)
    second = _submit(_chunk(tmp_path / "two", second_rows))
    refused = wait_terminal(OpenAIBatchHook(), second["batch_id"])
    assert refused.status is BatchStatus.FAILED and refused.errors[0]["code"] == "token_limit_exceeded"

    completed = SensorRun(second, token_limit_retry_interval=0.3, token_limit_max_wait=60).run()
    assert completed["attempts"][0]["status"] == "completed"
    assert completed["batch_id"] != second["batch_id"]  # the batch that really ran
    refused_ids = [b["id"] for b in batch_emulator.batches() if b["status"] == "failed"]
    assert second["batch_id"] in refused_ids
    _, merged = _merge(tmp_path / "two", [completed])
    _assert_every_row_once(merged, second_rows)
    assert {m["status"] for m in merged} == {"succeeded"}


def test_a_token_limit_refusal_that_never_clears_fails_in_the_end(batch_emulator, openai_conn, tmp_path):
    batch_emulator.set_faults(token_limit=10)  # smaller than the chunk itself
    submitted = _submit(_chunk(tmp_path, _rows(10)))
    with pytest.raises(BatchFailedError, match="enqueued-token limit"):
        SensorRun(submitted, token_limit_retry_interval=0.1, token_limit_max_wait=0.5).run()
    assert batch_emulator.stats()["openai"]["batches_created"] >= 2  # it did resubmit before giving up


def test_the_token_budget_gate_holds_a_chunk_until_there_is_room(batch_emulator, openai_conn, tmp_path):
    """token_budget: the submit waits (deferred) while in-flight tokens + this chunk exceed the budget."""
    batch_emulator.set_faults(slow=1.0)
    first = _submit(_chunk(tmp_path / "one", _rows(20, "a")), token_budget=300)
    metadata = batch_emulator.batches()[0]["metadata"]
    tokens = int(metadata["airflow_chunk_tokens"])
    assert 100 < tokens < 300 and metadata["airflow_model"] == "gpt-4o-mini"

    chunk = _chunk(tmp_path / "two", _rows(20, "b"))
    store = InMemoryTaskStateStore()
    op = SubmitBatchOperator(
        task_id="submit", chunk=chunk, token_budget={"gpt-4o-mini": 300}, token_budget_poll_interval=0.2
    )
    with pytest.raises(TaskDeferred) as info:
        op.execute(make_context(store))
    assert info.value.method_name == "resume_after_budget_wait"
    assert batch_emulator.stats()["openai"]["files_uploaded"] == 1  # nothing of the second chunk went out
    wait_terminal(OpenAIBatchHook(), first["batch_id"])
    fresh = SubmitBatchOperator(task_id="submit", chunk=chunk, token_budget={"gpt-4o-mini": 300})
    second = fresh.resume_after_budget_wait(make_context(store), None, **info.value.kwargs)
    assert second["batch_id"] and batch_emulator.stats()["openai"]["batches_created"] == 2


# -------------------------------------------------------------------------------- provider errors


@pytest.mark.parametrize(
    ("faults", "counter"),
    [
        ({"http_429_rate": 0.3, "retry_after": 0.05, "seed": 8}, "injected_429"),  # seeds: early calls are hit
        ({"http_500_rate": 0.2, "seed": 17}, "injected_500"),
        ({"drop_rate": 0.2, "seed": 14}, "dropped"),
    ],
    ids=["http-429-retry-after", "http-500", "dropped-connections"],
)
def test_api_errors_on_every_call_are_retried(batch_emulator, openai_conn, faults, counter, tmp_path):
    """--http-429-rate / --http-500-rate / --drop-rate: upload, create, poll, download all get through."""
    rows = _rows(30)
    batch_emulator.set_faults(**faults)
    completed = SensorRun(_submit(_chunk(tmp_path, rows)), max_poll_errors=20).run()
    _, merged = _merge(tmp_path, [completed])
    _assert_every_row_once(merged, rows)
    assert {m["status"] for m in merged} == {"succeeded"}
    assert batch_emulator.stats()["http"][counter] > 0
    stats = batch_emulator.stats()["openai"]
    assert stats["batches_created"] == 1 and stats["files_uploaded"] == 1  # retried POSTs made no duplicates


class _CutDownloads(httpx2.BaseTransport):
    """A transport that breaks the first ``cuts`` result downloads after ``after`` bytes."""

    def __init__(self, after: int, cuts: int = 1) -> None:
        self.inner = httpx2.HTTPTransport()
        self.after = after
        self.cuts = cuts

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        path = request.url.path
        if self.cuts and (path.endswith("/content") or path.endswith("/results")):
            self.cuts -= 1
            response.stream = _Cut(response.stream, self.after)
        return response


class _Cut(httpx2.SyncByteStream):
    def __init__(self, inner: Any, after: int) -> None:
        self.inner = inner
        self.after = after

    def __iter__(self):
        sent = 0
        for piece in self.inner:
            if sent + len(piece) >= self.after:
                yield piece[: self.after - sent]
                raise httpx2.ReadError("connection reset by peer (test)")
            sent += len(piece)
            yield piece

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_download_broken_mid_stream_restarts_without_duplicates(
    batch_emulator, openai_conn, anthropic_conn, provider, tmp_path, monkeypatch
):
    rows = _rows(200)
    completed = SensorRun(_submit(_chunk(tmp_path, rows, provider))).run()
    policy = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.01)
    if provider == "openai":
        hook: Any = OpenAIBatchHook(retry_policy=policy)
        client = httpx2.Client(transport=_CutDownloads(after=5000))
        hook.client = openai.OpenAI(api_key="k", base_url=batch_emulator.openai_base_url, http_client=client)
    else:
        import anthropic

        hook = AnthropicBatchHook(retry_policy=policy)
        client = httpx2.Client(transport=_CutDownloads(after=5000))
        hook.client = anthropic.Anthropic(api_key="k", base_url=batch_emulator.anthropic_base_url, http_client=client)
    transport = client._transport
    monkeypatch.setattr(MergeResultsOperator, "_hook", lambda self, provider: hook)
    _, merged = _merge(tmp_path, [completed])
    assert transport.cuts == 0  # the download really broke once
    _assert_every_row_once(merged, rows)
    assert {m["status"] for m in merged} == {"succeeded"}


# ---------------------------------------------------------------------------------- the example DAG


@pytest.mark.scenario
def test_the_example_dag_under_the_issue_faults(airflow_db, openai_conn, tmp_path, monkeypatch):
    """The issue's check at 3,000 rows: line errors, expiry and 429s on; every row once; retries right."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_batch_emulator.examples import synthetic_products
    from tests.conftest import REPO_ROOT

    faults = {"line_error_rate": 0.02, "expire_rate": 0.01, "http_429_rate": 0.05, "retry_after": 0.05}
    openai_conn.set_faults(**faults)
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    out = tmp_path / "out"
    conf = {"rows": 3000, "data_dir": str(tmp_path / "data"), "output_dir": str(out), "poll_interval": 0.2}
    assert dag.test(run_conf=conf).state == "success"

    source = synthetic_products(3000).to_pylist()
    merged = pq.read_table(out).to_pylist()
    assert [m["product_id"] for m in merged] == [s["product_id"] for s in source]  # every row, once, in order
    first_batch = openai_conn.batches()[0]["id"]
    fates = {s["product_id"]: line_fate(Faults(**faults), str(s["product_id"]), first_batch) for s in source}
    first_try_failed = {cid for cid, fate in fates.items() if fate != "ok"}
    assert 40 < len(first_try_failed) < 160
    sent = _sent(openai_conn)
    assert len(sent[0]) == 3000 and set(sent[0]) == set(fates)
    for followup in sent[1:]:  # follow-ups carry only lines that failed retryably, never a good one
        assert set(followup) <= first_try_failed
    for m in merged:
        if m["custom_id"] not in first_try_failed:
            assert (m["status"], m["attempts"]) == ("succeeded", 1)
        elif m["status"] == "succeeded":
            assert m["attempts"] > 1
        else:  # still failing after every retry: it says why
            assert m["attempts"] == 3 and m["status"] in ("errored", "expired") and m["error"]


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Migrate the test metadata DB (``dag.test()`` needs it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)
