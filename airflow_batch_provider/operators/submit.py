"""SubmitBatchOperator: one mapped task per chunk that turns a chunk file into a provider batch.

Submission is checkpointed so that a retry, a crash or a worker loss never creates a
second batch for the same chunk: an *intent* is recorded before the provider is called,
the uploaded file id and the batch id right after each call. A retry that finds a batch
id reattaches to it; one that finds only an intent first asks the provider whether the
batch exists (OpenAI: batch metadata carries the idempotency key).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.checkpoint import Checkpoint
from airflow_batch_provider.descriptors import ChunkDescriptor, SubmittedBatch
from airflow_batch_provider.hooks.base import BatchHook, get_batch_hook
from airflow_batch_provider.status import BatchStatus

CHECKPOINT_KEY = "batch_submission"
_DEAD = frozenset({BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.CANCELLING})


def idempotency_key(dag_id: str, run_id: str, task_id: str, map_index: int, fingerprint: str) -> str:
    """Return the key that identifies one chunk submission of one task instance."""
    raw = f"{dag_id}\x1f{run_id}\x1f{task_id}\x1f{map_index}\x1f{fingerprint}"
    return hashlib.sha256(raw.encode()).hexdigest()[:40]


class SubmitBatchOperator(BaseOperator):
    """Upload one chunk file and create its provider batch; return the chunk plus ``batch_id``.

    Map it over ChunkOperator's output::

        SubmitBatchOperator.partial(task_id="submit", conn_id="openai_batch_default").expand(chunk=chunks.output)

    :param chunk: a chunk descriptor from ChunkOperator.
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param provider: override the provider named in the chunk descriptor.
    :param metadata: extra batch metadata (OpenAI only; ≤ 16 pairs in total with ours).
    """

    template_fields: Sequence[str] = ("chunk", "conn_id", "metadata")
    ui_color = "#e8f1ff"

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        conn_id: str | None = None,
        provider: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("map_index_template", "{{ task.chunk['label'] }}")
        super().__init__(**kwargs)
        self.chunk = chunk
        self.conn_id = conn_id
        self.provider = provider
        self.metadata = dict(metadata or {})

    def _hook(self) -> BatchHook:
        return get_batch_hook(self.provider or self.chunk["provider"], self.conn_id)

    def execute(self, context: Context) -> SubmittedBatch:
        """Submit the chunk once, or reattach to the batch an earlier attempt created."""
        chunk: ChunkDescriptor = self.chunk  # type: ignore[assignment]
        hook = self._hook()
        ti = context.get("ti")
        dag_id = str(ti.dag_id) if ti is not None else str(self.dag_id)
        run_id = str(ti.run_id) if ti is not None else "no-run"
        map_index = int(ti.map_index) if ti is not None and ti.map_index is not None else -1
        key = idempotency_key(dag_id, run_id, self.task_id, map_index, chunk["fingerprint"])
        checkpoint = Checkpoint(context, CHECKPOINT_KEY)
        record = checkpoint.load()
        if record and record.get("fingerprint") != chunk["fingerprint"]:
            self.log.info("%s: the chunk changed since the last attempt; its checkpoint is ignored", chunk["label"])
            record = None

        if record and record.get("batch_id"):
            state = hook.get_state(record["batch_id"])
            if state.status not in _DEAD:
                self.log.info("%s: reattaching to batch %s (%s)", chunk["label"], state.batch_id, state.provider_status)
                return {**chunk, "batch_id": state.batch_id, "input_file_id": record.get("input_file_id")}
            self.log.warning(
                "%s: batch %s from an earlier attempt ended %s; submitting a new one",
                chunk["label"],
                state.batch_id,
                state.provider_status,
            )
            record = {"fingerprint": chunk["fingerprint"], "input_file_id": record.get("input_file_id")}

        if record is not None or not checkpoint.durable:
            since = (record or {}).get("intent_at")
            existing = [s for s in hook.find_existing(key, chunk, since=since) if s.status not in _DEAD]
            if existing:
                keep, *extra = existing
                for dup in extra if hook.exact_reconcile else ():
                    self.log.warning("%s: cancelling duplicate batch %s", chunk["label"], dup.batch_id)
                    hook.cancel(dup.batch_id)
                self.log.info("%s: found batch %s created by an earlier attempt", chunk["label"], keep.batch_id)
                checkpoint.save({**(record or {}), "fingerprint": chunk["fingerprint"], "batch_id": keep.batch_id})
                return {**chunk, "batch_id": keep.batch_id, "input_file_id": (record or {}).get("input_file_id")}

        record = {
            "fingerprint": chunk["fingerprint"],
            "idempotency_key": key,
            "intent_at": time.time(),
            **(record or {}),
        }
        checkpoint.save(record)  # the intent: from here on a retry must reconcile before submitting
        metadata = {
            **self.metadata,
            "airflow_idempotency_key": key,
            "airflow_dag_id": dag_id[:512],
            "airflow_run_id": run_id[:512],
            "airflow_task": f"{self.task_id}[{map_index}]"[:512],
            "chunk": chunk["label"][:512],
        }
        submitted = self._submit(hook, chunk, metadata, record, checkpoint)
        self.log.info(
            "%s: submitted %d requests as batch %s", chunk["label"], chunk["num_requests"], submitted["batch_id"]
        )
        return submitted

    def _submit(
        self,
        hook: BatchHook,
        chunk: ChunkDescriptor,
        metadata: Mapping[str, str],
        record: dict[str, Any],
        checkpoint: Checkpoint,
    ) -> SubmittedBatch:
        upload = getattr(hook, "upload_file", None)
        create = getattr(hook, "create_batch", None)
        if upload is None or create is None:  # providers without a separate upload step
            submitted = hook.submit(chunk, metadata=metadata)
            checkpoint.save({**record, "batch_id": submitted["batch_id"]})
            return submitted
        file_id = record.get("input_file_id")
        if file_id:
            self.log.info("%s: reusing uploaded file %s", chunk["label"], file_id)
        else:
            file_id = upload(chunk["requests_path"], chunk_label=chunk["label"])
            record = {**record, "input_file_id": file_id}
            checkpoint.save(record)
        state = create(file_id, chunk["endpoint"], metadata)
        checkpoint.save({**record, "batch_id": state.batch_id})
        return {**chunk, "batch_id": state.batch_id, "input_file_id": file_id}

    def on_kill(self) -> None:
        """Nothing to cancel here: the batch id is checkpointed and the sensor owns cancellation."""
