"""SubmitBatchOperator: one mapped task per chunk that turns a chunk file into a provider batch.

Submission is checkpointed so that a retry, a crash or a worker loss never creates a
second batch for the same chunk: an *intent* is recorded before the provider is called,
the uploaded file id and the batch id right after each call. A retry that finds a batch
id reattaches to it; one that finds only an intent first asks the provider whether the
batch exists (OpenAI: batch metadata carries the idempotency key). :func:`submit_once` holds
that logic; BatchCompleteSensor uses it too for its follow-up (line retry) batches.

With ``token_budget`` the operator also keeps the input tokens enqueued per model under a
budget before creating a batch (see :mod:`airflow_batch_provider.batches.token_budget`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.token_budget import (
    BudgetCheck,
    budget_for,
    check_budget_value,
    estimate_file_tokens,
    token_metadata,
)
from airflow_batch_provider.descriptors import ChunkDescriptor, SubmittedBatch
from airflow_batch_provider.hooks.base import BatchHook, get_batch_hook
from airflow_batch_provider.links import BatchConsoleLink, remember_batch_url
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.status import BatchStatus

CHECKPOINT_KEY = "batch_submission"
IDEMPOTENCY_METADATA_KEY = "airflow_idempotency_key"
_DEAD = frozenset({BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.CANCELLING})


def idempotency_key(dag_id: str, run_id: str, task_id: str, map_index: int, fingerprint: str) -> str:
    """Return the key that identifies one chunk submission of one task instance."""
    raw = f"{dag_id}\x1f{run_id}\x1f{task_id}\x1f{map_index}\x1f{fingerprint}"
    return hashlib.sha256(raw.encode()).hexdigest()[:40]


def task_ids(context: Context | Mapping[str, Any], default_dag_id: str) -> tuple[str, str, int]:
    """Return (dag_id, run_id, map_index) of the running task instance (placeholders in a bare context)."""
    ti = context.get("ti")
    dag_id = str(ti.dag_id) if ti is not None else default_dag_id
    run_id = str(ti.run_id) if ti is not None else "no-run"
    map_index = int(ti.map_index) if ti is not None and ti.map_index is not None else -1
    return dag_id, run_id, map_index


def chunk_input_tokens(chunk: ChunkDescriptor) -> int:
    """Return the input tokens of a chunk from ChunkOperator: its own estimate, else one from the file.

    ChunkOperator counts every chunk's tokens for its cost estimate (``estimated_input_tokens``,
    counted on the file as written, after ``skip_unchanged``); reading the requests file again
    here would cost about 0.1 s per 10,000 requests. Follow-up files (line retries) are smaller
    than the descriptor they are derived from, so :func:`submit_tagged` always reads its file.
    """
    known = chunk.get("estimated_input_tokens")
    if isinstance(known, int) and not isinstance(known, bool) and known > 0:
        return known
    return estimate_file_tokens(chunk["requests_path"], chunk["model"], chunk["provider"])


def batch_metadata(
    extra: Mapping[str, str], key: str, dag_id: str, run_id: str, task: str, label: str
) -> dict[str, str]:
    """Return the batch metadata we attach (OpenAI; ≤ 16 pairs with the user's ``extra``)."""
    return {
        **extra,
        IDEMPOTENCY_METADATA_KEY: key,
        "airflow_dag_id": dag_id[:512],
        "airflow_run_id": run_id[:512],
        "airflow_task": task[:512],
        "chunk": label[:512],
    }


def submit_once(
    hook: BatchHook,
    chunk: ChunkDescriptor,
    *,
    checkpoint: Checkpoint,
    key: str,
    metadata: Mapping[str, str],
    log: Any,
    prepare: Callable[[], Mapping[str, str]] | None = None,
) -> SubmittedBatch:
    """Create ``chunk``'s batch at most once per ``checkpoint``; return the chunk plus its batch id.

    Reattaches to a live batch recorded in the checkpoint, adopts one the provider already has
    for ``key`` (crash between create and checkpoint), or uploads and creates, checkpointing
    the intent, the file id and the batch id as it goes. ``prepare`` runs only when a new batch
    is about to be created; it may defer the task or return extra metadata.
    """
    record = checkpoint.load()
    if record and record.get("fingerprint") != chunk["fingerprint"]:
        log.info("%s: the chunk changed since the last attempt; its checkpoint is ignored", chunk["label"])
        record = None

    if record and record.get("batch_id"):
        state = hook.get_state(record["batch_id"])
        if state.status not in _DEAD:
            log.info("%s: reattaching to batch %s (%s)", chunk["label"], state.batch_id, state.provider_status)
            return {**chunk, "batch_id": state.batch_id, "input_file_id": record.get("input_file_id")}
        log.warning(
            "%s: batch %s from an earlier attempt ended %s; submitting a new one",
            chunk["label"],
            state.batch_id,
            state.provider_status,
        )
        record = {"fingerprint": chunk["fingerprint"], "input_file_id": record.get("input_file_id")}

    # Always ask the provider before creating: a missing record may mean the store was cleared
    # ([state_store] clear_on_success) rather than "never submitted". One list call per chunk.
    since = (record or {}).get("intent_at")
    existing = [s for s in hook.find_existing(key, chunk, since=since) if s.status not in _DEAD]
    if existing:
        keep, *extra = existing
        for dup in extra if hook.exact_reconcile else ():
            log.warning("%s: cancelling duplicate batch %s", chunk["label"], dup.batch_id)
            hook.cancel(dup.batch_id)
        log.info("%s: found batch %s created by an earlier attempt", chunk["label"], keep.batch_id)
        checkpoint.save({**(record or {}), "fingerprint": chunk["fingerprint"], "batch_id": keep.batch_id})
        return {**chunk, "batch_id": keep.batch_id, "input_file_id": (record or {}).get("input_file_id")}

    extra_metadata = dict(prepare()) if prepare is not None else {}
    record = {"fingerprint": chunk["fingerprint"], "idempotency_key": key, "intent_at": time.time(), **(record or {})}
    checkpoint.save(record)  # the intent: from here on a retry must reconcile before submitting
    return _create(hook, chunk, {**metadata, **extra_metadata}, record, checkpoint, log)


def submit_tagged(
    hook: BatchHook,
    chunk: ChunkDescriptor,
    context: Context,
    *,
    task_id: str,
    dag_id: str,
    tag: str,
    checkpoint_key: str,
    log: Any,
) -> SubmittedBatch:
    """Create one extra batch for a task (a sensor's follow-up or resubmission), once per ``tag``.

    Checkpointed under ``checkpoint_key`` in the task state store and keyed by ``<task_id>.<tag>``
    at the provider, so a retry of the task reattaches to the batch instead of creating another.
    """
    dag, run_id, map_index = task_ids(context, dag_id)
    task = f"{task_id}.{tag}"
    key = idempotency_key(dag, run_id, task, map_index, chunk["fingerprint"])

    def prepare() -> dict[str, str]:
        if getattr(hook, "in_flight_tokens", None) is None:
            return {}
        tokens = estimate_file_tokens(chunk["requests_path"], chunk["model"], chunk["provider"])
        return token_metadata(tokens, chunk["model"])

    return submit_once(
        hook,
        chunk,
        checkpoint=Checkpoint(context, checkpoint_key),
        key=key,
        metadata=batch_metadata({}, key, dag, run_id, f"{task}[{map_index}]", chunk["label"]),
        log=log,
        prepare=prepare,
    )


def _create(
    hook: BatchHook,
    chunk: ChunkDescriptor,
    metadata: Mapping[str, str],
    record: dict[str, Any],
    checkpoint: Checkpoint,
    log: Any,
) -> SubmittedBatch:
    upload = getattr(hook, "upload_file", None)
    create = getattr(hook, "create_batch", None)
    if upload is None or create is None:  # providers without a separate upload step
        submitted = hook.submit(chunk, metadata=metadata)
        checkpoint.save({**record, "batch_id": submitted["batch_id"]})
        return submitted
    file_id = record.get("input_file_id")
    if file_id:
        log.info("%s: reusing uploaded file %s", chunk["label"], file_id)
    else:
        file_id = upload(chunk["requests_path"], chunk_label=chunk["label"])
        record = {**record, "input_file_id": file_id}
        checkpoint.save(record)
    state = create(file_id, chunk["endpoint"], metadata)
    checkpoint.save({**record, "batch_id": state.batch_id})
    return {**chunk, "batch_id": state.batch_id, "input_file_id": file_id}


class SubmitBatchOperator(BaseOperator):
    """Upload one chunk file and create its provider batch; return the chunk plus ``batch_id``.

    Map it over ChunkOperator's output::

        SubmitBatchOperator.partial(task_id="submit", conn_id="openai_batch_default").expand(chunk=chunks.output)

    :param chunk: a chunk descriptor from ChunkOperator.
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param provider: override the provider named in the chunk descriptor.
    :param metadata: extra batch metadata (OpenAI only; ≤ 9 pairs: we add up to 7 of our own).
        Two of ours record the chunk's input tokens and model (ChunkOperator's estimate, see
        :func:`chunk_input_tokens`), which token budgets count.
    :param token_budget: input tokens allowed in flight per model (OpenAI's enqueued-token cap):
        an int for every model or a ``{model: tokens}`` map. Before creating a batch the operator
        sums the tokens of this deployment's non-terminal batches of the same model and, while
        this chunk would pass the budget, waits deferred. None (default): no gate.
    :param token_budget_poll_interval: seconds between budget checks while waiting.
    :param token_budget_max_wait: seconds to wait for room before submitting anyway (the
        sensor then waits out a ``token_limit_exceeded`` refusal and resubmits).
    """

    template_fields: Sequence[str] = ("chunk", "conn_id", "metadata")
    ui_color = "#e8f1ff"
    operator_extra_links = (BatchConsoleLink(),)

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        conn_id: str | None = None,
        provider: str | None = None,
        metadata: Mapping[str, str] | None = None,
        token_budget: int | Mapping[str, int] | None = None,
        token_budget_poll_interval: float = 60.0,
        token_budget_max_wait: float = 6 * 3600.0,
        map_index_template: str | None = "{{ task.chunk['label'] }}",
        **kwargs: Any,
    ) -> None:
        # A signature default (not kwargs.setdefault) so that .partial() picks it up for mapped tasks.
        super().__init__(map_index_template=map_index_template, **kwargs)
        self.chunk = chunk
        self.conn_id = conn_id
        self.provider = provider
        self.metadata = dict(metadata or {})
        self.token_budget = check_budget_value(token_budget)
        self.token_budget_poll_interval = float(token_budget_poll_interval)
        self.token_budget_max_wait = float(token_budget_max_wait)
        self._budget_wait_since: float | None = None

    def _hook(self) -> BatchHook:
        return get_batch_hook(self.provider or self.chunk["provider"], self.conn_id)

    def execute(self, context: Context) -> SubmittedBatch:
        """Submit the chunk once, or reattach to the batch an earlier attempt created."""
        chunk: ChunkDescriptor = self.chunk  # type: ignore[assignment]
        if chunk["num_requests"] == 0:  # every row unchanged (skip_unchanged): nothing to send, nothing to pay
            self.log.info("%s: no requests to send; the merge uses the stored results", chunk["label"])
            return {**chunk, "batch_id": ""}
        hook = self._hook()
        dag_id, run_id, map_index = task_ids(context, str(self.dag_id))
        key = idempotency_key(dag_id, run_id, self.task_id, map_index, chunk["fingerprint"])
        metadata = batch_metadata(self.metadata, key, dag_id, run_id, f"{self.task_id}[{map_index}]", chunk["label"])
        submitted = submit_once(
            hook,
            chunk,
            checkpoint=Checkpoint(context, CHECKPOINT_KEY),
            key=key,
            metadata=metadata,
            log=self.log,
            prepare=lambda: self._prepare(hook, chunk),
        )
        self.log.info("%s: %d requests in batch %s", chunk["label"], chunk["num_requests"], submitted["batch_id"])
        remember_batch_url(self, hook.batch_url(submitted["batch_id"]))
        metrics = BatchMetrics.from_context(context, provider=chunk["provider"], model=chunk["model"])
        metrics.requests_in_flight(chunk["num_requests"], chunk_index=chunk["chunk_index"])
        return submitted

    def resume_after_budget_wait(
        self, context: Context, event: Any = None, budget_wait_since: float | None = None
    ) -> SubmittedBatch:
        """Check the token budget again after a deferred wait (the trigger fired)."""
        self._budget_wait_since = budget_wait_since
        return self.execute(context)

    def _prepare(self, hook: BatchHook, chunk: ChunkDescriptor) -> dict[str, str]:
        """Record the chunk's tokens in the metadata and wait (deferred) while the token budget is full."""
        in_flight_tokens = getattr(hook, "in_flight_tokens", None)
        if in_flight_tokens is None:
            if self.token_budget is not None:
                self.log.info("%s: provider %s has no enqueued-token cap; token_budget is not checked",
                              chunk["label"], hook.provider)  # fmt: skip
            return {}
        tokens = chunk_input_tokens(chunk)
        extra = token_metadata(tokens, chunk["model"])
        budget = budget_for(self.token_budget, chunk["model"])
        if budget is None:
            return extra
        check = BudgetCheck(tokens=tokens, in_flight=in_flight_tokens(chunk["model"]), budget=budget)
        self.log.info("%s: token budget: %s", chunk["label"], check.describe(chunk["model"]))
        if check.fits:
            return extra
        since = self._budget_wait_since or time.time()
        waited = time.time() - since
        if waited >= self.token_budget_max_wait:
            self.log.warning(
                "%s: waited %.0f s for room in the token budget; submitting anyway (a token_limit_exceeded "
                "refusal is waited out by the sensor)",
                chunk["label"],
                waited,
            )
            return extra
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        self.log.info(
            "%s: waiting %.0f s for room in the token budget", chunk["label"], self.token_budget_poll_interval
        )
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=self.token_budget_poll_interval)),
            method_name="resume_after_budget_wait",
            kwargs={"budget_wait_since": since},
        )
        raise AssertionError("unreachable")  # pragma: no cover  (defer raises TaskDeferred)

    def on_kill(self) -> None:
        """Nothing to cancel here: the batch id is checkpointed and the sensor owns cancellation."""
