"""Anthropic Message Batches emulation driven by the real ``anthropic`` SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import jsonschema
import pytest

from airflow_batch_emulator.server import BatchEmulator
from tests.emulator import anthropic_request, wait_anthropic, wait_held


@pytest.fixture
def client(batch_emulator: BatchEmulator) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(api_key="test-key", base_url=batch_emulator.anthropic_base_url) as sdk:
        yield sdk


def test_round_trip_results_via_absolute_results_url(
    client: anthropic.Anthropic, batch_emulator: BatchEmulator
) -> None:
    requests = [anthropic_request(f"req-{i}", f"Question {i}") for i in range(30)]
    created = client.messages.batches.create(requests=requests)
    assert created.id.startswith("msgbatch_") and created.type == "message_batch"
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 30
    batch = wait_anthropic(client, created.id)
    assert batch.ended_at is not None and batch.expires_at > batch.created_at
    assert batch.results_url == f"{batch_emulator.url}/v1/messages/batches/{batch.id}/results"
    assert (batch.request_counts.succeeded, batch.request_counts.processing) == (30, 0)
    results = list(client.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in requests)
    assert [r.custom_id for r in results] != [r["custom_id"] for r in requests], "order must be shuffled"
    first = results[0].result
    assert first.type == "succeeded"
    assert first.message.role == "assistant" and first.message.stop_reason == "end_turn"
    assert first.message.content[0].type == "text" and first.message.usage.output_tokens > 0
    assert len({r.result.message.id for r in results if r.result.type == "succeeded"}) == 30
    raw = httpx2.get(batch.results_url or "", headers={"x-api-key": "k"}).content
    assert raw.endswith(b"\n") and b"\n\n" not in raw and b"\r" not in raw


def test_errored_canceled_expired_results(client: anthropic.Anthropic, batch_emulator: BatchEmulator) -> None:
    invalid: list[Any] = [
        {"custom_id": "no-model", "params": {"max_tokens": 5, "messages": []}},
        {"custom_id": "no-max", "params": {"model": "claude-haiku-4-5", "messages": []}},
    ]
    bad = wait_anthropic(client, client.messages.batches.create(requests=invalid).id)
    by_id = {r.custom_id: r.result for r in client.messages.batches.results(bad.id)}
    assert by_id["no-model"].type == "errored" and by_id["no-max"].type == "errored"
    assert by_id["no-model"].error.error.type == "invalid_request_error"

    requests: list[Any] = [anthropic_request(f"ok-{i}") for i in range(40)]
    batch_emulator.set_faults(expire_rate=0.2, line_error_rate=0.2)
    batch = wait_anthropic(client, client.messages.batches.create(requests=requests).id)
    by_id = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    kinds = [r.type for r in by_id.values()]
    assert {"succeeded", "errored", "expired"} <= set(kinds)
    assert any(r.type == "errored" and r.error.error.type == "api_error" for r in by_id.values())
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.expired) == (
        kinds.count("succeeded"),
        kinds.count("errored"),
        kinds.count("expired"),
    )

    batch_emulator.set_faults(slow=2)
    slow = client.messages.batches.create(requests=[anthropic_request(f"c{i}") for i in range(50)])
    time.sleep(0.3)
    assert client.messages.batches.cancel(slow.id).processing_status == "canceling"
    ended = wait_anthropic(client, slow.id)
    assert ended.cancel_initiated_at is not None
    assert ended.request_counts.canceled > 0 and ended.request_counts.succeeded > 0
    assert ended.request_counts.canceled + ended.request_counts.succeeded == 50
    results = list(client.messages.batches.results(slow.id))
    assert sum(r.result.type == "canceled" for r in results) == ended.request_counts.canceled


def test_provider_side_cancel_fault(client: anthropic.Anthropic, batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(cancel_batches=True)
    batch = wait_anthropic(
        client, client.messages.batches.create(requests=[anthropic_request(f"r{i}") for i in range(8)]).id
    )
    assert (batch.request_counts.succeeded, batch.request_counts.canceled) == (4, 4)


def test_list_pages_with_last_id_and_before_id(client: anthropic.Anthropic) -> None:
    ids = [client.messages.batches.create(requests=[anthropic_request("a")]).id for _ in range(5)]
    newest_first = ids[::-1]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2]
    assert page.has_more and page.last_id == newest_first[1] and page.first_id == newest_first[0]
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first
    before = client.messages.batches.list(limit=2, before_id=newest_first[3])
    assert [b.id for b in before.data] == newest_first[1:3]


def test_delete_only_after_ended(client: anthropic.Anthropic, batch_emulator: BatchEmulator) -> None:
    batch_emulator.set_faults(slow=5)
    running = client.messages.batches.create(requests=[anthropic_request("a")])
    with pytest.raises(anthropic.BadRequestError, match="ended"):
        client.messages.batches.delete(running.id)
    client.messages.batches.cancel(running.id)
    wait_anthropic(client, running.id)
    deleted = client.messages.batches.delete(running.id)
    assert (deleted.id, deleted.type) == (running.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(running.id)


CUSTOM_ID_CASES = [
    pytest.param(["has space"], id="space"),
    pytest.param(["x" * 65], id="too_long"),
    pytest.param([""], id="empty"),
    pytest.param(["dot.ted"], id="dot"),
    pytest.param(["same", "same"], id="duplicate"),
]


@pytest.mark.parametrize("custom_ids", CUSTOM_ID_CASES)
def test_custom_id_validation(client: anthropic.Anthropic, custom_ids: list[str]) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.batches.create(requests=[anthropic_request(c) for c in custom_ids])
    assert repr(custom_ids[-1]) in info.value.message
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_too_many_requests_is_413(batch_emulator: BatchEmulator) -> None:
    body = b'{"requests":[' + b",".join(b'{"custom_id":"r%d","params":{}}' % i for i in range(100_001)) + b"]}"
    response = httpx2.post(
        batch_emulator.anthropic_base_url + "/v1/messages/batches",
        content=body,
        headers={"x-api-key": "k", "content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "request_too_large"


def test_forced_tool_use_conforms_to_the_input_schema(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["pos", "neg"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "topics": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        },
        "required": ["sentiment", "confidence", "topics"],
    }
    tool = {"name": "record", "description": "Record the verdict", "input_schema": schema}
    requests = [
        anthropic_request(f"t{i}", f"Text {i}", tools=[tool], tool_choice={"type": "tool", "name": "record"})
        for i in range(10)
    ]
    batch = wait_anthropic(client, client.messages.batches.create(requests=requests).id)
    for item in client.messages.batches.results(batch.id):
        assert item.result.type == "succeeded"
        message = item.result.message
        assert message.stop_reason == "tool_use"
        block = message.content[0]
        assert block.type == "tool_use" and block.name == "record"
        jsonschema.validate(block.input, schema)


def test_max_tokens_stop_reason_and_realtime_messages(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude-haiku-4-5", max_tokens=2, messages=[{"role": "user", "content": "Tell me everything"}]
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2
    again = client.messages.create(
        model="claude-haiku-4-5", max_tokens=2, messages=[{"role": "user", "content": "Tell me everything"}]
    )
    assert again.content == message.content


@pytest.mark.parametrize(
    "headers",
    [pytest.param({"x-api-key": "k"}, id="x-api-key"), pytest.param({"Authorization": "Bearer k"}, id="bearer")],
)
def test_both_auth_headers_and_401_shape(batch_emulator: BatchEmulator, headers: dict[str, str]) -> None:
    url = batch_emulator.anthropic_base_url + "/v1/messages/batches"
    assert httpx2.get(url, headers=headers).status_code == 200
    denied = httpx2.get(url)
    assert denied.status_code == 401
    assert denied.json()["type"] == "error" and denied.json()["error"]["type"] == "authentication_error"


def test_polls_before_done_holds_a_finished_batch_until_the_third_retrieve(
    client: anthropic.Anthropic, batch_emulator: BatchEmulator
) -> None:
    batch_emulator.set_faults(polls_before_done=3)
    created = client.messages.batches.create(requests=[anthropic_request(f"r{i}") for i in range(20)])
    row = wait_held(batch_emulator, created.id)  # the engine is done: without the fault it would have ended
    assert (row["status"], row["polls"]) == ("in_progress", 0)
    time.sleep(0.3)  # several latencies more: still held
    assert [b.processing_status for b in client.messages.batches.list()] == ["in_progress"]  # not counted
    first = client.messages.batches.retrieve(created.id)
    second = client.messages.batches.retrieve(created.id)
    assert (first.processing_status, second.processing_status) == ("in_progress", "in_progress")
    assert second.results_url is None and second.request_counts.processing == 20
    results_url = f"{batch_emulator.url}/v1/messages/batches/{created.id}/results"  # the SDK's results() polls
    assert httpx2.get(results_url, headers={"x-api-key": "k"}).status_code == 404
    third = client.messages.batches.retrieve(created.id)
    assert third.processing_status == "ended" and third.ended_at is not None
    assert (third.request_counts.succeeded, third.request_counts.processing) == (20, 0)
    assert len(list(client.messages.batches.results(created.id))) == 20
    assert batch_emulator.stats()["anthropic"]["batches_held_for_polls"] == 1
    assert [(b["polls"], b["held"]) for b in batch_emulator.batches()] == [(4, False)]  # results() retrieved too


def test_truncate_rate_stops_at_max_tokens_with_text_or_tool_input_cut_short(
    client: anthropic.Anthropic, batch_emulator: BatchEmulator
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    }
    tool = {"name": "record", "description": "Record it", "input_schema": schema}
    requests: list[Any] = [anthropic_request(f"t{i}", f"Text {i}") for i in range(40)]
    requests += [
        anthropic_request(f"u{i}", f"Tool {i}", tools=[tool], tool_choice={"type": "tool", "name": "record"})
        for i in range(20)
    ]
    batch_emulator.set_faults(truncate_rate=0.3)
    batch = wait_anthropic(client, client.messages.batches.create(requests=requests).id)
    results = {r.custom_id: r.result.message for r in client.messages.batches.results(batch.id)}  # type: ignore[union-attr]
    cut = {cid for cid, message in results.items() if message.stop_reason == "max_tokens"}
    assert 8 < len(cut) < 40 and any(c.startswith("u") for c in cut) and any(c.startswith("t") for c in cut)
    for cid in cut:
        block = results[cid].content[0]
        if block.type == "tool_use":
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(block.input, schema)
        else:
            assert block.type == "text" and not block.text.endswith(".")
