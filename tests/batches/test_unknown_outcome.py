"""A create whose outcome is unknown (answer lost, answered after the client's timeout, landed after
the client hung up) must not be sent again before the key is looked up: one ``submit_once`` makes
exactly one batch. Real OpenAI SDK over HTTP against the emulator's unkind switches.
"""

from __future__ import annotations

import logging

import pytest

from airflow_batch_provider.backends.openai import hook as openai_hook_module
from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.submission import batch_metadata, idempotency_key, submit_once
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.support import InMemoryTaskStateStore, write_chunk

log = logging.getLogger(__name__)
CREATE = "POST /v1/batches"
# Backoff of 2-4 s between attempts: longer than the holds below, so a create still on its way
# when its client gave up has landed by the time the key is looked up.
POLICY = RetryPolicy(attempts=4, base_delay=2.0, max_delay=4.0)


def _submit(tmp_path, monkeypatch) -> str:
    monkeypatch.setattr(openai_hook_module, "CREATE_TIMEOUT", 0.5)
    chunk = write_chunk(tmp_path, [{"custom_id": f"u{i}", "text": f"t{i}"} for i in range(3)])
    key = idempotency_key("dag", "run", "submit", 0, chunk["fingerprint"])
    checkpoint = Checkpoint({"task_state_store": InMemoryTaskStateStore()}, "submit")
    submitted = submit_once(
        OpenAIBatchHook(retry_policy=POLICY),
        chunk,
        checkpoint=checkpoint,
        key=key,
        metadata=batch_metadata({}, key, "dag", "run", "submit[0]", chunk["label"]),
        log=log,
    )
    return submitted["batch_id"]


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param({"lose_answer_routes": {CREATE: 1}}, id="processed-answer-lost-500"),
        pytest.param({"lose_answer_routes": {CREATE: 1}, "lose_answer_as": "drop"}, id="processed-connection-dropped"),
        pytest.param({"delay_after_routes": {CREATE: 1.0}}, id="answered-after-the-client-timeout"),
        pytest.param({"delay_routes": {CREATE: 1.0}, "process_after_hangup": True}, id="landed-after-hang-up"),
    ],
)
def test_one_submit_makes_one_batch_whatever_happens_to_the_answer(openai_conn, tmp_path, monkeypatch, faults):
    openai_conn.set_faults(slow=30.0, **faults)
    batch_id = _submit(tmp_path, monkeypatch)
    created = openai_conn.batches()
    assert [b["id"] for b in created] == [batch_id], f"one create, one batch; the emulator holds {created}"
    assert openai_conn.stats()["openai"]["batches_created"] == 1


def test_a_first_attempt_looks_for_its_key_only_as_far_back_as_the_run(openai_conn, tmp_path, monkeypatch):
    """No checkpoint (a cleared store): the key is looked up among batches since the run started, not in the
    organisation's whole history. 150 older batches: one list page reaches past the run's start instead of two,
    and a batch of this key made in the run is still found (no second create)."""
    import time

    # The real 300 s allowance would need a slow test; created_at has 1 s resolution, so just over 1 s.
    monkeypatch.setattr(openai_hook_module, "CLOCK_SKEW_S", 1.05)
    hook = OpenAIBatchHook()
    import uuid

    chunk = write_chunk(tmp_path, [{"custom_id": f"k-{uuid.uuid4().hex}", "text": "t"}])  # a key no other test has
    file_id = hook.upload_file(chunk["requests_path"])
    for _ in range(150):  # the organisation's earlier batches
        hook.create_batch(chunk, input_file_id=file_id, metadata={})
    time.sleep(2.2)  # past the allowance
    run_started = time.time()
    key = idempotency_key("dag", "run", "submit", 0, chunk["fingerprint"])
    metadata = batch_metadata({}, key, "dag", "run", "submit[0]", chunk["label"])
    made = hook.create_batch(chunk, input_file_id=file_id, metadata=metadata)  # then the store was cleared

    import openai.pagination

    pages: list[int] = []  # this process's sync list pages only (the emulator's route counter is shared)
    first_page, next_page = openai.resources.batches.Batches.list, openai.pagination.SyncCursorPage.get_next_page
    monkeypatch.setattr(
        openai.resources.batches.Batches, "list", lambda *a, **k: pages.append(1) or first_page(*a, **k)
    )
    monkeypatch.setattr(
        openai.pagination.SyncCursorPage, "get_next_page", lambda self: pages.append(1) or next_page(self)
    )

    def submit(key_since: float | None) -> tuple[str, int]:
        pages.clear()
        checkpoint = Checkpoint({"task_state_store": InMemoryTaskStateStore()}, "submit")
        batch = submit_once(hook, chunk, checkpoint=checkpoint, key=key, metadata=metadata, log=log,
                            key_since=key_since)  # fmt: skip
        return batch["batch_id"], len(pages)

    assert submit(run_started) == (made, 1)
    assert submit(None) == (made, 2)  # unknown start (a cleared run): every page is read
