"""OpenAI Batch API emulation driven by the real ``openai`` SDK: lifecycle, validation, faults, outputs."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from openai.types import Batch

from airflow_batch_emulator.server import BatchEmulator
from tests.emulator import CHAT, EMBEDDINGS, chat_line, read_jsonl, submit, to_jsonl, wait_held, wait_openai


@pytest.fixture
def client(batch_emulator: BatchEmulator) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(api_key="test-key", base_url=batch_emulator.openai_base_url) as sdk:
        yield sdk


def test_round_trip_completes_with_every_field(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    rows = [chat_line(f"row-{i}", f"Question {i}") for i in range(40)]
    created = submit(client, rows, metadata={"dag": "demo", "chunk": "3"})
    assert created.status == "validating"
    assert created.metadata == {"dag": "demo", "chunk": "3"}
    batch = wait_openai(client, created.id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (40, 40, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.expires_at
    assert batch.model == "gpt-4o-mini"
    assert batch.error_file_id is None
    assert batch.usage is not None and batch.usage.total_tokens > 0
    output = read_jsonl(client, batch.output_file_id)
    assert sorted(row["custom_id"] for row in output) == sorted(row["custom_id"] for row in rows)
    assert [row["custom_id"] for row in output] != [row["custom_id"] for row in rows], "order must be shuffled"
    first = output[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    body = first["response"]["body"]
    assert first["response"]["status_code"] == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert client.files.retrieve(batch.output_file_id or "").purpose == "batch_output"
    stats = batch_emulator.stats()["openai"]
    assert stats["batches_created"] == 1 and stats["requests_succeeded"] == 40
    assert stats["batches_by_status"] == {"completed": 1}


def test_answers_are_deterministic_and_pick_offered_labels(client: openai.OpenAI) -> None:
    prompt = "Classify the review.\nLabels: positive, negative, neutral\nReview: fine."
    rows = [chat_line("a", prompt), chat_line("b", prompt), chat_line("c", "Say something")]
    outputs = [read_jsonl(client, wait_openai(client, submit(client, rows).id).output_file_id) for _ in range(2)]
    answers = [{r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in o} for o in outputs]
    assert answers[0] == answers[1]
    assert answers[0]["a"] == answers[0]["b"] and answers[0]["a"] in {"positive", "negative", "neutral"}
    assert answers[0]["c"].startswith("Synthetic answer")


def test_max_tokens_truncates_with_finish_reason_length(client: openai.OpenAI) -> None:
    rows = [chat_line("short", "Tell me a story", max_tokens=2), chat_line("new", "Story", max_completion_tokens=3)]
    output = {
        r["custom_id"]: r["response"]["body"]
        for r in read_jsonl(client, wait_openai(client, submit(client, rows).id).output_file_id)
    }
    assert output["short"]["choices"][0]["finish_reason"] == "length"
    assert output["short"]["usage"]["completion_tokens"] == 2
    assert len(output["short"]["choices"][0]["message"]["content"]) <= 8
    assert output["new"]["usage"]["completion_tokens"] == 3


def _line(**overrides: Any) -> dict[str, Any]:
    row = chat_line("x")
    row.update(overrides)
    return row


VALIDATION_CASES = [
    pytest.param(b"", "empty_file", None, id="empty_file"),
    pytest.param(to_jsonl([chat_line("a")]) + b"{not json\n", "invalid_json_line", 2, id="invalid_json_line"),
    pytest.param(to_jsonl([chat_line("a"), chat_line("a")]), "duplicate_custom_id", 2, id="duplicate_custom_id"),
    pytest.param(to_jsonl([chat_line("a", url=EMBEDDINGS)]), "url_mismatch", 1, id="url_mismatch"),
    pytest.param(to_jsonl([chat_line("a"), chat_line("b", model="gpt-4o")]), "model_mismatch", 2, id="model_mismatch"),
    pytest.param(to_jsonl([chat_line(f"r{i}") for i in range(50_001)]), "too_many_tasks", None, id="too_many_tasks"),
    pytest.param(to_jsonl([{"method": "POST", "url": CHAT, "body": {}}]), "missing_required_parameter", 1, id="no_id"),
    pytest.param(
        to_jsonl([{"custom_id": "a", "method": "POST", "url": CHAT}]), "missing_required_parameter", 1, id="no_body"
    ),
]


@pytest.mark.parametrize(("data", "code", "line"), VALIDATION_CASES)
def test_validation_failures(client: openai.OpenAI, data: bytes, code: str, line: int | None) -> None:
    batch = wait_openai(client, submit(client, data).id)
    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data
    error = batch.errors.data[0]
    assert (error.code, error.line) == (code, line)
    assert error.message
    assert batch.output_file_id is None and batch.error_file_id is None


def _create(client: openai.OpenAI, **overrides: Any) -> None:
    uploaded = client.files.create(file=("in.jsonl", to_jsonl([chat_line("a")])), purpose="batch")
    args: dict[str, Any] = {"input_file_id": uploaded.id, "endpoint": CHAT, "completion_window": "24h"}
    args.update(overrides)
    client.batches.create(**args)


CREATE_REJECTIONS = [
    pytest.param({"endpoint": "/v1/unknown"}, "endpoint", id="unknown_endpoint"),
    pytest.param({"completion_window": "48h"}, "completion_window", id="window"),
    pytest.param({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", id="metadata_17_pairs"),
    pytest.param({"metadata": {"k" * 65: "v"}}, "metadata", id="metadata_long_key"),
    pytest.param({"metadata": {"k": "v" * 513}}, "metadata", id="metadata_long_value"),
    pytest.param({"input_file_id": "file-missing"}, "input_file_id", id="missing_file"),
]


@pytest.mark.parametrize(("overrides", "param"), CREATE_REJECTIONS)
def test_create_rejects_bad_requests(client: openai.OpenAI, overrides: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, **overrides)
    assert info.value.status_code == 400
    assert info.value.param == param


def test_create_rejects_a_file_whose_purpose_is_not_batch(client: openai.OpenAI) -> None:
    uploaded = client.files.create(file=("in.jsonl", to_jsonl([chat_line("a")])), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")


def test_list_pages_newest_first_with_after(client: openai.OpenAI) -> None:
    uploaded = client.files.create(file=("in.jsonl", to_jsonl([chat_line("a")])), purpose="batch")
    ids = [
        client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h").id for _ in range(7)
    ]
    first = client.batches.list(limit=3)
    assert [b.id for b in first.data] == ids[::-1][:3]
    assert first.has_more is True
    walked = [b.id for b in client.batches.list(limit=3)]  # auto-paging follows `after`
    assert walked == ids[::-1]
    with pytest.raises(openai.BadRequestError):
        client.batches.list(limit=101)


def test_cancel_mid_way_keeps_processed_lines(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(slow=1.5)
    created = submit(client, [chat_line(f"r{i}") for i in range(300)])
    deadline = time.monotonic() + 5
    while True:
        batch = client.batches.retrieve(created.id)
        assert batch.request_counts is not None
        if batch.status == "in_progress" and batch.request_counts.completed > 0:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    cancelled = client.batches.cancel(created.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None
    final = wait_openai(client, created.id)
    assert final.status == "cancelled" and final.cancelled_at is not None
    assert final.request_counts is not None
    done = final.request_counts.completed
    assert 0 < done < 300
    assert len(read_jsonl(client, final.output_file_id)) == done


def test_cancel_of_a_finished_batch_is_a_conflict(client: openai.OpenAI) -> None:
    batch = wait_openai(client, submit(client, [chat_line("a")]).id)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_does_not_exist")


LINE_FAULTS = [
    pytest.param("line_error_rate", 500, "server_error", id="server_error"),
    pytest.param("invalid_line_rate", 400, "invalid_request_error", id="invalid_request"),
]


@pytest.mark.parametrize(("fault", "status", "error_type"), LINE_FAULTS)
def test_line_faults_go_to_the_error_file(
    client: openai.OpenAI, batch_emulator: BatchEmulator, fault: str, status: int, error_type: str
) -> None:
    batch_emulator.set_faults(**{fault: 0.3})
    batch = wait_openai(client, submit(client, [chat_line(f"r{i}") for i in range(60)]).id)
    assert batch.status == "completed"
    errors = read_jsonl(client, batch.error_file_id)
    output = read_jsonl(client, batch.output_file_id)
    assert batch.request_counts is not None
    assert 0 < len(errors) == batch.request_counts.failed
    assert len(output) == batch.request_counts.completed == 60 - len(errors)
    for row in errors:
        assert row["response"]["status_code"] == status
        assert row["response"]["body"]["error"]["type"] == error_type
        assert row["error"] is None
    again = wait_openai(client, submit(client, [chat_line(f"r{i}") for i in range(60)]).id)
    failed_again = {r["custom_id"] for r in read_jsonl(client, again.error_file_id)}
    if fault == "invalid_line_rate":  # a bad request stays bad
        assert failed_again == {r["custom_id"] for r in errors}
    else:  # a server error is transient: resent in another batch, the line rolls again
        assert failed_again != {r["custom_id"] for r in errors}


def test_expired_lines_and_expired_batch(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(expire_rate=0.25)
    batch = wait_openai(client, submit(client, [chat_line(f"r{i}") for i in range(40)]).id)
    assert batch.status == "expired" and batch.expired_at is not None
    expired = read_jsonl(client, batch.error_file_id)
    output = read_jsonl(client, batch.output_file_id)
    assert expired and all(r["response"] is None and r["error"]["code"] == "batch_expired" for r in expired)
    assert batch.request_counts is not None
    assert len(output) == batch.request_counts.completed == 40 - len(expired)
    assert batch_emulator.stats()["openai"]["requests_expired"] == len(expired)


def test_fail_validation_and_provider_cancel_faults(client: openai.OpenAI, batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(fail_validation="duplicate_custom_id")
    failed = wait_openai(client, submit(client, [chat_line("a")]).id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    assert failed.errors.data[0].code == "duplicate_custom_id"
    batch_emulator.set_faults(cancel_batches=True)
    cancelled = wait_openai(client, submit(client, [chat_line(f"r{i}") for i in range(10)]).id)
    assert cancelled.status == "cancelled"
    assert len(read_jsonl(client, cancelled.output_file_id)) == 5


def test_token_limit_refuses_a_batch_over_the_enqueued_cap(
    client: openai.OpenAI, batch_emulator: BatchEmulator
) -> None:
    rows = [chat_line(f"r{i}", "x" * 396) for i in range(10)]  # 99 + 3 tokens each, 1,020 per batch
    batch_emulator.set_faults(token_limit=1500, slow=5)
    first = _past_validation(client, submit(client, rows).id)
    assert first.status == "in_progress"
    second = _past_validation(client, submit(client, rows).id)
    assert second.status == "failed" and second.errors and second.errors.data
    assert second.errors.data[0].code == "token_limit_exceeded"
    other_model = _past_validation(client, submit(client, [chat_line("m", model="gpt-4.1")]).id)
    assert other_model.status == "in_progress"
    for batch_id in (first.id, other_model.id):
        client.batches.cancel(batch_id)
        assert wait_openai(client, batch_id).status == "cancelled"


def _past_validation(client: openai.OpenAI, batch_id: str) -> Batch:
    while (batch := client.batches.retrieve(batch_id)).status == "validating":
        time.sleep(0.02)
    return batch


def test_structured_output_conforms_to_the_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": ["spam", "ham"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "minimum": 3, "maximum": 9},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "nested": {"$ref": "#/$defs/Inner"},
        },
        "required": ["label", "score", "count", "flag", "tags", "nested"],
        "additionalProperties": False,
        "$defs": {
            "Inner": {
                "type": "object",
                "properties": {"why": {"type": "string"}, "when": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                "required": ["why", "when"],
            }
        },
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}}
    rows = [chat_line(f"r{i}", f"Item {i}", response_format=response_format) for i in range(20)]
    output = read_jsonl(client, wait_openai(client, submit(client, rows).id).output_file_id)
    assert len(output) == 20
    for row in output:
        jsonschema.validate(json.loads(row["response"]["body"]["choices"][0]["message"]["content"]), schema)


def test_embeddings_batch_vectors(client: openai.OpenAI) -> None:
    rows = [
        {"custom_id": "a", "method": "POST", "url": EMBEDDINGS, "body": {"model": "te-3", "input": "hello"}},
        {"custom_id": "b", "method": "POST", "url": EMBEDDINGS, "body": {"model": "te-3", "input": "hello"}},
        {
            "custom_id": "c",
            "method": "POST",
            "url": EMBEDDINGS,
            "body": {"model": "te-3", "input": ["x", "y"], "dimensions": 8},
        },
    ]
    output = {
        r["custom_id"]: r["response"]["body"]
        for r in read_jsonl(client, wait_openai(client, submit(client, rows, EMBEDDINGS).id).output_file_id)
    }
    vector = output["a"]["data"][0]["embedding"]
    assert len(vector) == 16 and math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-9)
    assert vector == output["b"]["data"][0]["embedding"]
    assert [d["index"] for d in output["c"]["data"]] == [0, 1]
    assert all(len(d["embedding"]) == 8 for d in output["c"]["data"])
    assert output["c"]["object"] == "list" and output["c"]["usage"]["prompt_tokens"] > 0


def test_request_errors_in_bodies_become_400_lines(client: openai.OpenAI) -> None:
    rows = [chat_line("ok"), {"custom_id": "bad", "method": "POST", "url": CHAT, "body": {"messages": []}}]
    batch = wait_openai(client, submit(client, rows).id)
    errors = read_jsonl(client, batch.error_file_id)
    assert [(r["custom_id"], r["response"]["status_code"]) for r in errors] == [("bad", 400)]


@pytest.mark.parametrize(
    ("faults", "held_in", "final"),
    [
        pytest.param({}, "finalizing", "completed", id="completes"),
        pytest.param({"expire_rate": 1.0}, "in_progress", "expired", id="expires"),
    ],
)
def test_polls_before_done_holds_a_finished_batch_until_the_third_retrieve(
    client: openai.OpenAI, batch_emulator: BatchEmulator, faults: dict[str, Any], held_in: str, final: str
) -> None:
    batch_emulator.set_faults(polls_before_done=3, **faults)
    created = submit(client, [chat_line(f"r{i}") for i in range(20)])
    row = wait_held(batch_emulator, created.id)  # the engine is done: without the fault it would have ended
    assert (row["status"], row["polls"]) == (held_in, 0)
    time.sleep(0.3)  # several latencies more: still held
    assert [b.status for b in client.batches.list()] == [held_in]  # listing does not count
    first = client.batches.retrieve(created.id)
    second = client.batches.retrieve(created.id)
    assert (first.status, second.status) == (held_in, held_in)
    assert first.output_file_id is None and first.error_file_id is None
    third = client.batches.retrieve(created.id)
    assert third.status == final
    assert third.request_counts is not None and third.request_counts.total == 20
    if final == "completed":
        assert third.completed_at is not None and len(read_jsonl(client, third.output_file_id)) == 20
    else:
        assert third.expired_at is not None and len(read_jsonl(client, third.error_file_id)) == 20
    assert client.batches.retrieve(created.id).status == final
    assert batch_emulator.stats()["openai"]["batches_held_for_polls"] == 1
    assert [(b["polls"], b["held"]) for b in batch_emulator.batches()] == [(4, False)]


def test_truncate_rate_cuts_the_same_answers_short_every_run(
    client: openai.OpenAI, batch_emulator: BatchEmulator
) -> None:
    """--truncate-rate: finish_reason "length" and the text (or a forced tool call's JSON) ends early."""
    tool = {"type": "function", "function": {"name": "verdict", "parameters": {"type": "object", "properties": {}}}}
    lines = [chat_line(f"r{i}") for i in range(60)]
    lines += [
        chat_line(f"j{i}", tools=[tool], tool_choice={"type": "function", "function": {"name": "verdict"}})
        for i in range(20)
    ]
    whole = {
        r["custom_id"]: r for r in read_jsonl(client, wait_openai(client, submit(client, lines).id).output_file_id)
    }
    batch_emulator.set_faults(truncate_rate=0.3)
    first = read_jsonl(client, wait_openai(client, submit(client, lines).id).output_file_id)
    cut = {r["custom_id"] for r in first if r["response"]["body"]["choices"][0]["finish_reason"] == "length"}
    assert 10 < len(cut) < 40 and any(c.startswith("j") for c in cut)
    for row in first:
        choice = row["response"]["body"]["choices"][0]
        full = whole[row["custom_id"]]["response"]["body"]["choices"][0]["message"]
        if row["custom_id"] not in cut:
            assert choice["finish_reason"] in ("stop", "tool_calls") or choice["message"] == full
            continue
        if row["custom_id"].startswith("j"):  # JSON arguments end early: no longer valid JSON
            got = choice["message"]["tool_calls"][0]["function"]["arguments"]
            assert full["tool_calls"][0]["function"]["arguments"].startswith(got)
            with pytest.raises(json.JSONDecodeError):
                json.loads(got)
        else:
            assert (
                full["content"].startswith(choice["message"]["content"])
                and choice["message"]["content"] != full["content"]
            )
    again = read_jsonl(client, wait_openai(client, submit(client, lines).id).output_file_id)
    assert {r["custom_id"] for r in again if r["response"]["body"]["choices"][0]["finish_reason"] == "length"} == cut
