"""Gemini job states and result lines: the mapping (unknown states refused) and parsing into the merged schema."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from airflow_batch_provider.backends.gemini.results import parse_gemini_line
from airflow_batch_provider.backends.gemini.states import counts_from_operation, map_gemini_state, state_from_gemini
from airflow_batch_provider.batches.line_retry import is_retryable
from airflow_batch_provider.exceptions import ResultsError, UnknownBatchStatusError
from airflow_batch_provider.status import BatchStatus, RequestCounts


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("JOB_STATE_PENDING", BatchStatus.VALIDATING),
        ("JOB_STATE_RUNNING", BatchStatus.IN_PROGRESS),
        ("JOB_STATE_SUCCEEDED", BatchStatus.COMPLETED),
        ("JOB_STATE_FAILED", BatchStatus.FAILED),
        ("JOB_STATE_CANCELLED", BatchStatus.CANCELLED),
        ("JOB_STATE_EXPIRED", BatchStatus.EXPIRED),
    ],
)
def test_state_mapping(state, expected):
    assert map_gemini_state(state, "batches/b") is expected
    assert map_gemini_state(SimpleNamespace(value=state), "batches/b") is expected  # the SDK's enum member


@pytest.mark.parametrize("state", ["JOB_STATE_PAUSED", "BATCH_STATE_SUCCEEDED", "", None])
def test_unknown_state_is_an_error(state):
    with pytest.raises(UnknownBatchStatusError, match="batches/b1"):
        map_gemini_state(state, "batches/b1")


def test_state_from_sdk_job_keeps_times_and_result_file():
    job = SimpleNamespace(
        name="batches/b1",
        state="JOB_STATE_SUCCEEDED",
        dest=SimpleNamespace(file_name="files/out"),
        error=None,
        create_time="2026-12-01T10:00:00Z",
        end_time="2026-12-01T10:05:00Z",
    )
    state = state_from_gemini(job, counts=RequestCounts(total=3, completed=2, failed=1))
    assert (state.provider, state.provider_status, state.output_file_id) == (
        "gemini",
        "JOB_STATE_SUCCEEDED",
        "files/out",
    )
    assert state.ended_at - state.created_at == 300
    assert state.counts == RequestCounts(total=3, completed=2, failed=1)


def test_counts_from_operation_reads_int64_strings():
    op = {"metadata": {"batchStats": {"requestCount": "10", "successfulRequestCount": "7", "failedRequestCount": "2"}}}
    assert counts_from_operation(op) == RequestCounts(total=10, completed=7, failed=2)
    assert counts_from_operation({"metadata": {"batchStats": {"requestCount": "x"}}}) == RequestCounts()


def _response(text, finish="STOP", **usage):
    parts = [{"text": "thinking...", "thought": True}, {"text": text}]
    return {
        "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": finish}],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 5, **usage},
    }


def test_success_line():
    record = parse_gemini_line(orjson.dumps({"key": "k1", "response": _response('{"a":1}', thoughtsTokenCount=7)}))
    assert record["custom_id"] == "k1"
    assert (record["status"], record["response"], record["finish_reason"]) == ("succeeded", '{"a":1}', "stop")
    assert (record["input_tokens"], record["output_tokens"], record["http_status"]) == (12, 12, 200)


def test_max_tokens_is_length():
    record = parse_gemini_line(orjson.dumps({"key": "k", "response": _response('{"a":', "MAX_TOKENS")}))
    assert (record["status"], record["finish_reason"]) == ("succeeded", "length")


@pytest.mark.parametrize(("code", "status", "retryable"), [(500, "INTERNAL", True), (429, "RESOURCE_EXHAUSTED", True),
                                                           (400, "INVALID_ARGUMENT", False)])  # fmt: skip
def test_error_lines(code, status, retryable):
    line = {"key": "k", "error": {"code": code, "message": "boom", "status": status}}
    record = parse_gemini_line(orjson.dumps(line))
    assert (record["status"], record["error"], record["error_code"], record["http_status"]) == (
        "errored",
        "boom",
        status,
        code,
    )
    assert is_retryable(record) is retryable


def test_blocked_prompt_and_withheld_answer_are_errors():
    blocked = {"key": "k", "response": {"promptFeedback": {"blockReason": "SAFETY"}}}
    assert parse_gemini_line(orjson.dumps(blocked))["error_code"] == "prompt_blocked"
    withheld = {"key": "k", "response": {"candidates": [{"finishReason": "SAFETY"}]}}
    record = parse_gemini_line(orjson.dumps(withheld))
    assert (record["status"], record["error_code"]) == ("errored", "content_filter")


@pytest.mark.parametrize("line", [b"not json", b'{"response": {}}', b'{"key": 5, "response": {}}'])
def test_unreadable_line_raises(line):
    with pytest.raises(ResultsError, match="Unreadable Gemini result line"):
        parse_gemini_line(line)
