"""AnthropicBatchHook with the real anthropic SDK against the emulator over HTTP."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import orjson
import pytest

from airflow_batch_provider.backends.anthropic.hook import map_anthropic_status
from airflow_batch_provider.exceptions import UnknownBatchStatusError
from airflow_batch_provider.status import BatchStatus
from tests.conftest import wait_terminal
from tests.support import write_chunk


def _line(custom_id: str, text: str, **params) -> dict:
    return {
        "custom_id": custom_id,
        "params": {
            "model": "claude-haiku-5-5",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": text}],
            **params,
        },
    }


def _chunk(tmp_path, lines, rows=None):
    rows = rows or [{"custom_id": line["custom_id"], "text": "x"} for line in lines]
    chunk = write_chunk(tmp_path, rows, lines=lines, endpoint="/v1/messages", model="claude-haiku-5-5")
    return {**chunk, "provider": "anthropic"}


def _counts(**kw):
    base = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (SimpleNamespace(id="b", processing_status="in_progress", cancel_initiated_at=None, request_counts=_counts(processing=3)), BatchStatus.IN_PROGRESS),
        (SimpleNamespace(id="b", processing_status="canceling", cancel_initiated_at="t", request_counts=_counts()), BatchStatus.CANCELLING),
        (SimpleNamespace(id="b", processing_status="ended", cancel_initiated_at=None, request_counts=_counts(succeeded=3)), BatchStatus.COMPLETED),
        (SimpleNamespace(id="b", processing_status="ended", cancel_initiated_at=None, request_counts=_counts(succeeded=1, errored=2)), BatchStatus.COMPLETED),
        (SimpleNamespace(id="b", processing_status="ended", cancel_initiated_at=None, request_counts=_counts(succeeded=1, expired=2)), BatchStatus.EXPIRED),
        (SimpleNamespace(id="b", processing_status="ended", cancel_initiated_at="t", request_counts=_counts(canceled=3)), BatchStatus.CANCELLED),
    ],
    ids=["in_progress", "canceling", "ended", "ended-with-errors", "ended-expired", "ended-cancelled"],
)  # fmt: skip
def test_status_mapping(batch, expected):
    assert map_anthropic_status(batch) is expected


def test_unknown_status_is_an_error():
    batch = SimpleNamespace(
        id="msgbatch_1", processing_status="archived", cancel_initiated_at=None, request_counts=_counts()
    )
    with pytest.raises(UnknownBatchStatusError, match="msgbatch_1"):
        map_anthropic_status(batch)


def test_create_wait_results(anthropic_hook, anthropic_conn, tmp_path):
    lines = [_line(f"a{i}", f"hello {i}") for i in range(20)]
    submitted = anthropic_hook.submit(_chunk(tmp_path, lines), metadata={})
    assert submitted["batch_id"].startswith("msgbatch_")
    state = wait_terminal(anthropic_hook, submitted["batch_id"])
    assert state.status is BatchStatus.COMPLETED
    assert state.counts.total == 20 and state.counts.completed == 20
    results = list(anthropic_hook.iter_results(state))
    assert sorted(r["custom_id"] for r in results) == sorted(line["custom_id"] for line in lines)
    assert all(r["status"] == "succeeded" and r["response"] and r["finish_reason"] for r in results)
    assert all(r["input_tokens"] and r["output_tokens"] for r in results)
    assert anthropic_conn.stats()["anthropic"]["batches_created"] == 1


def test_every_result_type(anthropic_conn, anthropic_hook, tmp_path):
    """succeeded, errored (bad params, surfaced at the end like the real API), expired, canceled."""
    bad = [{"custom_id": "bad", "params": {"model": "claude-haiku-5-5", "messages": []}}]  # no max_tokens
    state = wait_terminal(anthropic_hook, anthropic_hook.submit(_chunk(tmp_path / "b", bad), metadata={})["batch_id"])
    (result,) = anthropic_hook.iter_results(state)
    assert result["status"] == "errored" and result["error"] and result["error_code"] == "invalid_request_error"
    assert state.status is BatchStatus.COMPLETED  # errored requests do not fail the batch

    anthropic_conn.set_faults(expire_rate=0.3, line_error_rate=0.2, seed=5)
    lines = [_line(f"r{i}", "x") for i in range(40)]
    state = wait_terminal(anthropic_hook, anthropic_hook.submit(_chunk(tmp_path, lines), metadata={})["batch_id"])
    results = {r["custom_id"]: r for r in anthropic_hook.iter_results(state)}
    statuses = {r["status"] for r in results.values()}
    assert {"succeeded", "errored", "expired"} <= statuses
    assert state.status is BatchStatus.EXPIRED

    anthropic_conn.set_faults(slow=30.0)
    lines = [_line(f"c{i}", "x") for i in range(10)]
    batch_id = anthropic_hook.submit(_chunk(tmp_path / "c", lines), metadata={})["batch_id"]
    anthropic_hook.cancel(batch_id)
    state = wait_terminal(anthropic_hook, batch_id)
    assert state.status is BatchStatus.CANCELLED
    statuses = [r["status"] for r in anthropic_hook.iter_results(state)]
    assert len(statuses) == 10 and "canceled" in statuses and set(statuses) <= {"canceled", "succeeded"}


def test_forced_tool_call_becomes_the_json_answer(anthropic_hook, tmp_path):
    schema = {
        "type": "object",
        "properties": {"label": {"type": "string", "enum": ["a", "b"]}, "confidence": {"type": "number"}},
        "required": ["label", "confidence"],
    }
    tool = {"name": "classification", "description": "Record the answer.", "input_schema": schema}
    lines = [
        _line(f"t{i}", "x", tools=[tool], tool_choice={"type": "tool", "name": "classification"}) for i in range(5)
    ]
    state = wait_terminal(anthropic_hook, anthropic_hook.submit(_chunk(tmp_path, lines), metadata={})["batch_id"])
    for record in anthropic_hook.iter_results(state):
        answer = orjson.loads(record["response"])
        assert answer["label"] in ("a", "b") and isinstance(answer["confidence"], float | int)
        assert record["finish_reason"] == "tool_calls"


def test_async_state_matches_sync(anthropic_hook, tmp_path):
    batch_id = anthropic_hook.submit(_chunk(tmp_path, [_line("s", "x")]), metadata={})["batch_id"]
    final = wait_terminal(anthropic_hook, batch_id)
    assert asyncio.run(anthropic_hook.aget_state(batch_id)) == final


def test_find_existing_lists_candidates_by_time_and_size_and_owns_tells_them_apart(anthropic_hook, tmp_path):
    since = time.time()
    chunk3 = _chunk(tmp_path / "a", [_line(f"x{i}", "x") for i in range(3)])
    chunk4 = _chunk(tmp_path / "b", [_line(f"y{i}", "x") for i in range(4)])
    other3 = _chunk(tmp_path / "c", [_line(f"z{i}", "x") for i in range(3)])  # another chunk, the same size
    b3 = anthropic_hook.submit(chunk3, metadata={})["batch_id"]
    anthropic_hook.submit(chunk4, metadata={})
    assert [s.batch_id for s in anthropic_hook.find_existing("k", chunk3, since=since)] == [b3]
    assert anthropic_hook.find_existing("k", chunk3, since=None) == []
    z3 = anthropic_hook.submit(other3, metadata={})["batch_id"]
    assert [s.batch_id for s in anthropic_hook.find_existing("k", chunk3, since=since)] == [z3, b3]
    running = anthropic_hook.get_state(z3)
    assert running.status.is_terminal or anthropic_hook.owns(running, chunk3) is None  # not known while it runs
    ended = {batch_id: wait_terminal(anthropic_hook, batch_id) for batch_id in (b3, z3)}
    assert anthropic_hook.owns(ended[b3], chunk3) is True
    assert anthropic_hook.owns(ended[z3], chunk3) is False
