"""line_retry: which failed lines are resent, and the follow-up files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from airflow_batch_provider.backends.anthropic.results import parse_anthropic_result
from airflow_batch_provider.batches.line_retry import (
    AttemptScan,
    attempt_requests_path,
    cancelled_by_us,
    chunk_of,
    describe_failure,
    followup_chunk,
    is_retryable,
    mark_cancelled_by_us,
    nothing_to_retry,
    read_custom_ids,
    retry_path,
    scan_attempt,
    write_followup,
)
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.results.parse import parse_openai_line
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from tests.support import write_chunk


def _openai_http(status: int, type_: str) -> bytes:
    body = {"error": {"message": f"HTTP {status} here", "type": type_, "code": None}}
    return orjson.dumps({"custom_id": "x", "response": {"status_code": status, "body": body}, "error": None})


def _openai_error(code: str) -> bytes:
    return orjson.dumps({"custom_id": "x", "response": None, "error": {"code": code, "message": f"{code} here"}})


def _anthropic(kind: str, error_type: str | None = None) -> dict:
    result: dict = {"type": kind}
    if error_type:
        result["error"] = {"type": "error", "error": {"type": error_type, "message": f"{error_type} here"}}
    return {"custom_id": "x", "result": result}


RETRYABLE_CASES = [
    ("openai-500-server_error", parse_openai_line(_openai_http(500, "server_error")), True),
    ("openai-503", parse_openai_line(_openai_http(503, "service_unavailable")), True),
    ("openai-429", parse_openai_line(_openai_http(429, "rate_limit_exceeded")), True),
    ("openai-408", parse_openai_line(_openai_http(408, "timeout")), True),
    ("openai-400-invalid", parse_openai_line(_openai_http(400, "invalid_request_error")), False),
    ("openai-401", parse_openai_line(_openai_http(401, "authentication_error")), False),
    ("openai-404-model", parse_openai_line(_openai_http(404, "model_not_found")), False),
    ("openai-batch_expired", parse_openai_line(_openai_error("batch_expired")), True),
    ("openai-batch_cancelled", parse_openai_line(_openai_error("batch_cancelled")), True),
    ("openai-unknown-error-code", parse_openai_line(_openai_error("content_policy")), False),
    ("anthropic-api_error", parse_anthropic_result(_anthropic("errored", "api_error")), True),
    ("anthropic-overloaded", parse_anthropic_result(_anthropic("errored", "overloaded_error")), True),
    ("anthropic-rate_limit", parse_anthropic_result(_anthropic("errored", "rate_limit_error")), True),
    ("anthropic-invalid_request", parse_anthropic_result(_anthropic("errored", "invalid_request_error")), False),
    ("anthropic-expired", parse_anthropic_result(_anthropic("expired")), True),
    ("anthropic-canceled", parse_anthropic_result(_anthropic("canceled")), True),
]


@pytest.mark.parametrize(("record", "expected"), [c[1:] for c in RETRYABLE_CASES], ids=[c[0] for c in RETRYABLE_CASES])
def test_is_retryable(record, expected):
    assert is_retryable(record) is expected


def test_canceled_lines_are_not_resent_when_we_cancelled():
    record = parse_anthropic_result(_anthropic("canceled"))
    assert is_retryable(record, cancelled_by_us=False)
    assert not is_retryable(record, cancelled_by_us=True)


@pytest.mark.parametrize("status", ["succeeded", "invalid_output"])
def test_successes_and_invalid_answers_are_final(status):
    record = {**parse_anthropic_result(_anthropic("expired")), "status": status}
    assert not is_retryable(record)


def test_describe_failure_groups_by_status_code_and_message():
    record = parse_openai_line(_openai_http(500, "server_error"))
    assert describe_failure(record) == "errored/server_error: HTTP 500 here"
    long = {**record, "error": "x" * 500}
    assert len(describe_failure(long)) < 160


def test_paths(tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}], index=3)
    assert retry_path(str(tmp_path), 3, 2).endswith("retries/chunk-00003.attempt-2.jsonl")
    assert attempt_requests_path(chunk, 1) == chunk["requests_path"]
    assert attempt_requests_path(chunk, 3) == retry_path(chunk["job_dir"], 3, 3)


def test_write_followup_keeps_original_bytes_and_order(tmp_path):
    rows = [{"custom_id": f"r{i}", "text": f"t{i}"} for i in range(10)]
    chunk = write_chunk(tmp_path, rows)
    dest = retry_path(str(tmp_path), 0, 2)
    written = write_followup(chunk["requests_path"], ["r7", "r2", "r5"], dest)
    lines = Path(chunk["requests_path"]).read_bytes().splitlines(keepends=True)
    original = {orjson.loads(line)["custom_id"]: line for line in lines}
    data = Path(dest).read_bytes()
    assert data == original["r2"] + original["r5"] + original["r7"]  # the chunk's order, not the request's
    assert read_custom_ids(dest) == ["r2", "r5", "r7"]
    assert (written.num_requests, written.num_bytes) == (3, len(data))
    assert written.fingerprint == hashlib.sha256(data).hexdigest()
    # the same ids give the same file (a retried task rebuilds it identically)
    assert write_followup(chunk["requests_path"], ["r5", "r7", "r2"], dest) == written


def test_write_followup_rejects_ids_of_another_chunk(tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    dest = retry_path(str(tmp_path), 0, 2)
    with pytest.raises(ResultsError, match="not in"):
        write_followup(chunk["requests_path"], ["a", "zzz"], dest)
    assert not (tmp_path / "retries" / "chunk-00000.attempt-2.jsonl").exists()  # nothing half-written


def test_followup_chunk_points_at_the_retry_file(tmp_path):
    chunk = write_chunk(tmp_path, [{"custom_id": f"r{i}", "text": "t"} for i in range(4)])
    batch = {**chunk, "batch_id": "b1", "input_file_id": "f1", "state": {}, "cost_upper_bound_usd": 1.0}
    assert "batch_id" not in chunk_of(batch) and "cost_upper_bound_usd" not in chunk_of(batch)
    written = write_followup(chunk["requests_path"], ["r1"], retry_path(str(tmp_path), 0, 2))
    follow = followup_chunk(batch, 2, written)
    assert follow["requests_path"] == written.path and follow["num_requests"] == 1
    assert follow["rows_path"] == chunk["rows_path"] and follow["label"] == f"{chunk['label']} attempt 2"
    assert follow["fingerprint"] != chunk["fingerprint"]


def _state(total: int, completed: int, failed: int = 0) -> BatchState:
    return BatchState("b1", "openai", BatchStatus.COMPLETED, "completed", RequestCounts(total, completed, failed))


def test_nothing_to_retry_reads_the_counters():
    assert nothing_to_retry(_state(10, 10))
    assert not nothing_to_retry(_state(10, 9, 1))
    assert not nothing_to_retry(_state(0, 0))


def test_scan_sorts_retryable_from_final_failures():
    failed = [
        {**parse_openai_line(_openai_http(500, "server_error")), "custom_id": "a"},
        {**parse_openai_line(_openai_http(400, "invalid_request_error")), "custom_id": "b"},
        {**parse_openai_line(_openai_error("batch_expired")), "custom_id": "c"},
        {**parse_openai_line(_openai_error("batch_expired")), "custom_id": "c"},  # a duplicate line counts once
    ]

    def never() -> list:
        raise AssertionError("counters add up: no full read needed")

    scan = scan_attempt(failed, state=_state(5, 2, 2), requested=never, all_results=never)
    assert isinstance(scan, AttemptScan)
    assert scan.retry_ids == ["a", "c"]
    assert scan.final_failed == 1 and "errored/invalid_request_error" in next(iter(scan.final_failures))
    assert sum(scan.retryable.values()) == 2


def test_scan_finds_lines_without_any_result():
    answered = [{**parse_openai_line(_openai_http(500, "server_error")), "custom_id": "a"}]
    succeeded = {**answered[0], "custom_id": "b", "status": "succeeded"}
    scan = scan_attempt(
        answered,
        state=_state(4, 1, 1),
        requested=lambda: ["a", "b", "c", "d"],
        all_results=lambda: [*answered, succeeded],
    )
    assert scan.retry_ids == ["a", "c", "d"]
    assert scan.retryable["missing/-: no result line"] == 2


def test_cancel_markers(tmp_path):
    assert cancelled_by_us(str(tmp_path), "batch_1") is None
    assert cancelled_by_us(None, "batch_1") is None
    mark_cancelled_by_us(str(tmp_path), "batch_1", "its task was killed")
    assert cancelled_by_us(str(tmp_path), "batch_1") == "its task was killed"
    assert cancelled_by_us(str(tmp_path), "batch_2") is None


def test_a_provider_batch_id_cannot_escape_the_job_folder(tmp_path):
    """A batch id is the provider's text: ``../../x`` must not become a path outside the job folder."""
    job = tmp_path / "job"
    hostile = ["../../x", "a/b", "a_b/..", "arn:aws:bedrock:us-east-1:1:model-invocation-job/abc", "x" * 300]
    for batch_id in hostile:
        mark_cancelled_by_us(str(job), batch_id, f"cancelled {batch_id[:10]}")
        assert cancelled_by_us(str(job), batch_id) == f"cancelled {batch_id[:10]}"
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert len(written) == len(hostile)  # each id its own marker
    assert all(p.parent == job / "retries" / "cancelled" for p in written)
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.json").exists()
    assert cancelled_by_us(str(job), "a_b") is None  # a cleaned id never reads another's marker
    mark_cancelled_by_us(str(job), "batch_abc123", "plain")
    assert (job / "retries" / "cancelled" / "batch_abc123.json").exists()  # plain ids stay readable
