"""Anthropic batches carry no key: a retry must never adopt another chunk's batch, and must adopt its own.

Two chunks A and B of the same size, the issue's sequence: B records its intent and its create
does not land (or lands with its answer lost); A creates its batch; B retries. Real Anthropic SDK
over HTTP against the emulator; the sensor is the real BatchCompleteSensor, poking.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from airflow_batch_provider.backends.anthropic.hook import AnthropicBatchHook
from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.submission import idempotency_key, submit_once
from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.sensors.batch import BatchCompleteSensor
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.conftest import wait_terminal
from tests.support import InMemoryTaskStateStore, make_context, write_chunk

log = logging.getLogger(__name__)
MODEL = "claude-haiku-4-5"
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def _chunk(tmp_path, index: int) -> dict[str, Any]:
    rows = [{"custom_id": f"c{index}-r{i}", "text": f"t{i}"} for i in range(4)]  # row ids: unique per job
    lines = [
        {"custom_id": r["custom_id"], "params": {"model": MODEL, "max_tokens": 16,
                                                 "messages": [{"role": "user", "content": r["text"]}]}}
        for r in rows
    ]  # fmt: skip
    chunk = write_chunk(tmp_path / "job", rows, index=index, num_chunks=2, lines=lines, model=MODEL)
    return {**chunk, "provider": "anthropic", "endpoint": "/v1/messages"}


def _submit(hook, chunk, store: InMemoryTaskStateStore) -> dict[str, Any]:
    key = idempotency_key("dag", "run", "submit", chunk["chunk_index"], chunk["fingerprint"])
    checkpoint = Checkpoint({"task_state_store": store}, "submit")
    return dict(submit_once(hook, chunk, checkpoint=checkpoint, key=key, metadata={}, log=log))


def _b_create_never_lands(hook, b, store) -> None:
    """What B's first try leaves when its create never reached the provider: an intent, no batch."""
    store.set("submit", {"fingerprint": b["fingerprint"], "idempotency_key": "k", "intent_at": time.time()})


@pytest.fixture
def hook(anthropic_conn) -> AnthropicBatchHook:
    return AnthropicBatchHook(retry_policy=FAST)


def test_b_never_adopts_a_finished_batch_of_a(anthropic_conn, hook, tmp_path):
    a, b = _chunk(tmp_path, 0), _chunk(tmp_path, 1)
    store_b = InMemoryTaskStateStore()
    _b_create_never_lands(hook, b, store_b)
    a_batch = _submit(hook, a, InMemoryTaskStateStore())["batch_id"]
    wait_terminal(hook, a_batch)
    b_batch = _submit(hook, b, store_b)
    assert b_batch["batch_id"] != a_batch and not b_batch.get("adopted_unproven")
    assert anthropic_conn.stats()["anthropic"]["batches_created"] == 2


def test_b_adopts_a_running_batch_of_a_only_provisionally_and_sends_its_own_when_it_ends(
    anthropic_conn, hook, tmp_path
):
    anthropic_conn.set_faults(polls_before_done=3)
    a, b = _chunk(tmp_path, 0), _chunk(tmp_path, 1)
    store_b = InMemoryTaskStateStore()
    _b_create_never_lands(hook, b, store_b)
    a_batch = _submit(hook, a, InMemoryTaskStateStore())["batch_id"]
    b_batch = _submit(hook, b, store_b)
    assert b_batch["batch_id"] == a_batch and b_batch["adopted_unproven"] is True
    sensor = BatchCompleteSensor(task_id="wait", batch=b_batch, poll_interval=0.05, deferrable=False,
                                 max_line_retries=0)  # fmt: skip
    done = sensor.execute(make_context(InMemoryTaskStateStore(), map_index=1))
    ids = [item["custom_id"] for item in hook._stream_results(done["attempts"][0]["batch_id"])]
    assert done["attempts"][0]["batch_id"] != a_batch
    assert sorted(ids) == [f"c1-r{i}" for i in range(4)]  # B's rows, not A's
    assert anthropic_conn.stats()["anthropic"]["batches_created"] == 2


def test_a_retry_adopts_its_own_batch_among_equal_size_ones(anthropic_conn, hook, tmp_path):
    a, b = _chunk(tmp_path, 0), _chunk(tmp_path, 1)
    store_b = InMemoryTaskStateStore()
    anthropic_conn.set_faults(lose_answer_routes={"POST /v1/messages/batches": 1})
    with pytest.raises(ProviderCallError):  # B's create took effect, its answer was lost: not sent again
        _submit(hook, b, store_b)
    anthropic_conn.set_faults()
    a_batch = _submit(hook, a, InMemoryTaskStateStore())["batch_id"]
    ours = [x["id"] for x in anthropic_conn.batches() if x["id"] != a_batch]
    assert len(ours) == 1
    for batch_id in (a_batch, ours[0]):
        wait_terminal(hook, batch_id)
    retried = _submit(hook, b, store_b)
    assert retried["batch_id"] == ours[0] and not retried.get("adopted_unproven")
    assert anthropic_conn.stats()["anthropic"]["batches_created"] == 2


def test_a_batch_of_the_same_rows_made_before_the_intent_is_not_adopted(anthropic_conn, hook, tmp_path):
    """Another run over the same table (the same row ids) made its batch seconds before this chunk's intent.
    Its rows would prove it "own", so the window is read on the provider's clock (its Date header), not with
    two minutes of slack: the retry sends its own batch instead of taking the other run's answers (which may
    come from another prompt)."""
    a = _chunk(tmp_path, 0)
    other_run = hook.submit(a, metadata={})["batch_id"]
    wait_terminal(hook, other_run)
    time.sleep(4.5)  # the Date header has 1 s resolution; the slack is 2 s
    store = InMemoryTaskStateStore()
    store.set("submit", {"fingerprint": a["fingerprint"], "idempotency_key": "k", "intent_at": time.time()})
    assert _submit(hook, a, store)["batch_id"] != other_run


def test_clock_offset_reads_the_date_header():
    from email.utils import formatdate

    from airflow_batch_provider.backends.anthropic.hook import clock_offset

    now = time.time()
    assert abs(clock_offset(formatdate(now + 30, usegmt=True), now) - 30) <= 1.0
    assert clock_offset(None, now) is None and clock_offset("yesterday-ish", now) is None
