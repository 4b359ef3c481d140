"""SubmitBatchOperator on the Gemini backend: one batch per chunk across crashes, found again by display name."""

from __future__ import annotations

from airflow_batch_provider.backends.gemini.hook import GeminiBatchHook
from airflow_batch_provider.batches.submission import idempotency_key
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY
from airflow_batch_provider.operators.submit import CHECKPOINT_KEY, SubmitBatchOperator
from airflow_batch_provider.status import BatchStatus
from tests.backends.gemini.conftest import gemini_chunk
from tests.conftest import wait_terminal
from tests.support import InMemoryTaskStateStore, make_context


def _gemini_stats(emulator) -> dict:
    return emulator.stats()["gemini"]


def test_crash_after_create_before_checkpoint_finds_the_batch(gemini_conn, tmp_path):
    """Intent recorded, batch created, batch id lost (SIGKILL): the retry finds the batch by its display name."""
    store = InMemoryTaskStateStore()
    chunk = gemini_chunk(tmp_path, 4)
    first = SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(store))
    record = store.get(CHECKPOINT_KEY)
    del record["batch_id"]
    store.set(CHECKPOINT_KEY, record)
    second = SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(store))
    assert second["batch_id"] == first["batch_id"]
    assert _gemini_stats(gemini_conn)["batches_created"] == 1
    assert _gemini_stats(gemini_conn)["files_uploaded"] == 1  # the checkpointed upload was reused too


def test_duplicates_found_on_reconcile_are_cancelled(gemini_conn, tmp_path):
    """Two batches carry the key (an orphaned create landed): one is adopted, the other cancelled."""
    gemini_conn.set_faults(slow=30.0)
    chunk = gemini_chunk(tmp_path, 2)
    hook = GeminiBatchHook()
    key = idempotency_key("test_dag", "run-1", "submit", 0, chunk["fingerprint"])
    file_id = hook.upload_file(chunk["requests_path"])
    made = [hook.create_batch(chunk, input_file_id=file_id, metadata={IDEMPOTENCY_METADATA_KEY: key}) for _ in "ab"]
    store = InMemoryTaskStateStore()
    store.set(CHECKPOINT_KEY, {"fingerprint": chunk["fingerprint"], "idempotency_key": key})
    result = SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(store))
    assert result["batch_id"] in made
    (other,) = [batch_id for batch_id in made if batch_id != result["batch_id"]]
    assert wait_terminal(hook, other).status is BatchStatus.CANCELLED
    assert _gemini_stats(gemini_conn)["batches_created"] == 2
