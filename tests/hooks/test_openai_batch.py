"""OpenAIBatchHook with the real openai SDK against the emulator over HTTP."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.backends.openai.states import map_openai_status
from airflow_batch_provider.exceptions import ProviderCallError, UnknownBatchStatusError
from airflow_batch_provider.status import BatchStatus
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.conftest import wait_terminal
from tests.support import chat_line, write_chunk


@pytest.mark.parametrize(
    ("provider_status", "expected"),
    [
        ("validating", BatchStatus.VALIDATING),
        ("in_progress", BatchStatus.IN_PROGRESS),
        ("finalizing", BatchStatus.FINALIZING),
        ("completed", BatchStatus.COMPLETED),
        ("failed", BatchStatus.FAILED),
        ("expired", BatchStatus.EXPIRED),
        ("cancelling", BatchStatus.CANCELLING),
        ("cancelled", BatchStatus.CANCELLED),
    ],
    ids=lambda v: str(v),
)
def test_status_mapping(provider_status, expected):
    assert map_openai_status(provider_status, "batch_x") is expected


@pytest.mark.parametrize("status", ["paused", "", None, "COMPLETED"])
def test_unknown_status_is_an_error_naming_the_batch(status):
    with pytest.raises(UnknownBatchStatusError, match="batch_x"):
        map_openai_status(status, "batch_x")


def test_openai_type_connection_is_accepted(monkeypatch):
    """A connection made for Airflow's own OpenAI provider (conn type ``openai``) works unchanged."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_OPENAI",
        json.dumps(
            {
                "conn_type": "openai",
                "password": "sk-test-key-value",
                "extra": {"openai_client_kwargs": {"base_url": "http://127.0.0.1:1/v1", "organization": "org-1"}},
            }
        ),
    )
    client = OpenAIBatchHook(conn_id="my_openai").client
    assert str(client.base_url) == "http://127.0.0.1:1/v1/"
    assert client.organization == "org-1"
    assert client.api_key == "sk-test-key-value"


def test_extra_base_url_wins_over_host(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_OB",
        json.dumps(
            {
                "conn_type": "openai_batch",
                "host": "http://ignored:1/v1",
                "password": "key-12345",
                "extra": {"base_url": "http://127.0.0.1:2/v1", "project": "proj_1"},
            }
        ),
    )
    client = OpenAIBatchHook(conn_id="ob").client
    assert str(client.base_url) == "http://127.0.0.1:2/v1/"
    assert client.project == "proj_1"


def test_missing_api_key_says_where_to_put_it(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_NOKEY", json.dumps({"conn_type": "openai_batch", "host": "http://127.0.0.1:1/v1"}))
    with pytest.raises(Exception, match="password field"):
        OpenAIBatchHook(conn_id="nokey").client  # noqa: B018


def test_submit_poll_and_stream_results(openai_hook, openai_conn, tmp_path):
    rows = [{"custom_id": f"id-{i}", "text": f"hello {i}"} for i in range(25)]
    chunk = write_chunk(tmp_path, rows)
    submitted = openai_hook.submit(chunk, metadata={"airflow_idempotency_key": "k1"})
    assert submitted["batch_id"].startswith("batch")
    state = wait_terminal(openai_hook, submitted["batch_id"])
    assert state.status is BatchStatus.COMPLETED
    assert state.counts.total == 25
    results = list(openai_hook.iter_results(state))
    assert sorted(r["custom_id"] for r in results) == sorted(r["custom_id"] for r in rows)
    assert all(r["status"] == "succeeded" and r["response"] for r in results)
    assert all(r["input_tokens"] and r["output_tokens"] for r in results)
    assert openai_conn.stats()["openai"]["files_uploaded"] == 1


def test_async_state_matches_sync(openai_hook, tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    final = wait_terminal(openai_hook, batch_id)
    async_state = asyncio.run(openai_hook.aget_state(batch_id))
    assert async_state == final


def test_find_existing_by_idempotency_key(openai_hook, tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    first = openai_hook.submit(chunk, metadata={"airflow_idempotency_key": "key-A"})
    openai_hook.submit(chunk, metadata={"airflow_idempotency_key": "key-B"})
    found = openai_hook.find_existing("key-A", chunk)
    assert [s.batch_id for s in found] == [first["batch_id"]]
    assert openai_hook.find_existing("key-C", chunk) == []


def test_cancel_moves_batch_to_cancelled(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(slow=2.0)
    chunk = write_chunk(tmp_path, [{"custom_id": f"c{i}", "text": "x"} for i in range(50)])
    batch_id = openai_hook.submit(chunk, metadata={})["batch_id"]
    state = openai_hook.cancel(batch_id)
    assert state.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    assert wait_terminal(openai_hook, batch_id).status is BatchStatus.CANCELLED


def test_error_file_lines_are_parsed(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(invalid_line_rate=1.0)
    chunk = write_chunk(tmp_path, [{"custom_id": f"e{i}", "text": "x"} for i in range(5)])
    state = wait_terminal(openai_hook, openai_hook.submit(chunk, metadata={})["batch_id"])
    assert state.error_file_id
    results = list(openai_hook.iter_results(state))
    assert {r["status"] for r in results} == {"errored"}
    assert all(r["http_status"] == 400 and r["error"] for r in results)


def test_large_file_streams_line_by_line(openai_hook, tmp_path):
    """Output bigger than one 1 MiB read: lines split across reads must come back whole."""
    long_text = "word " * 400
    lines = [chat_line(f"L{i}", long_text) for i in range(3000)]
    chunk = write_chunk(tmp_path, [{"custom_id": f"L{i}", "text": long_text} for i in range(3000)], lines=lines)
    assert chunk["num_bytes"] > 2 * 1024 * 1024
    state = wait_terminal(openai_hook, openai_hook.submit(chunk, metadata={})["batch_id"])
    ids = [r["custom_id"] for r in openai_hook.iter_results(state)]
    assert sorted(ids) == sorted(f"L{i}" for i in range(3000))


def test_transient_500s_are_retried_above_the_sdk(openai_conn, tmp_path):
    """With the SDK's own retries off, our policy alone must carry the call through 500s."""
    openai_conn.set_faults(http_500_rate=0.5)
    hook = OpenAIBatchHook(max_retries=0, retry_policy=RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.02))
    chunk = write_chunk(tmp_path, [{"custom_id": "r1", "text": "x"}])
    batch_id = hook.submit(chunk, metadata={})["batch_id"]
    assert wait_terminal(hook, batch_id).status is BatchStatus.COMPLETED
    assert openai_conn.stats()["http"]["injected_500"] > 0


def test_permanent_failure_raises_provider_call_error(openai_conn, tmp_path):
    openai_conn.set_faults(http_500_rate=1.0)
    hook = OpenAIBatchHook(max_retries=0, retry_policy=RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01))
    chunk = write_chunk(tmp_path, [{"custom_id": "r1", "text": "x"}])
    with pytest.raises(ProviderCallError, match="chunk 1/1"):
        hook.submit(chunk, metadata={})
