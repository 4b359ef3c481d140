"""Create a chunk's batch at most once, whatever retries and crashes happen in between.

Submission is checkpointed so that a retry, a crash or a worker loss never creates a
second batch for the same chunk: an *intent* is recorded before the provider is called,
the uploaded file id and the batch id right after each call. A retry that finds a batch
id reattaches to it; one that finds only an intent first asks the provider whether the
batch exists (OpenAI: batch metadata carries the idempotency key). :func:`submit_once` holds
that logic for SubmitBatchOperator; :func:`submit_tagged` is the same for the extra batches
BatchCompleteSensor sends (line retries, resubmissions).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.token_budget import estimate_file_tokens, token_metadata
from airflow_batch_provider.descriptors import ChunkDescriptor, SubmittedBatch
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY, BatchHook
from airflow_batch_provider.jobs.retention import require_requests_file
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.status import BatchState, BatchStatus

if TYPE_CHECKING:
    from airflow.sdk import Context

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
    metrics: BatchMetrics | None = None,
    key_since: float | None = None,
    first_try: bool = False,
) -> SubmittedBatch:
    """Create ``chunk``'s batch at most once per ``checkpoint``; return the chunk plus its batch id.

    Reattaches to a live batch recorded in the checkpoint, adopts one the provider already has
    for ``key`` (crash between create and checkpoint), or uploads and creates, checkpointing
    the intent, the file id and the batch id as it goes. ``prepare`` runs only when a new batch
    is about to be created; it may defer the task or return extra metadata. ``key_since`` is a
    time before any batch with ``key`` can have been created (the run's start); without it and
    without a recorded intent, the provider's whole batch list is read to look for the key.
    ``first_try``: the task's first try in a run never cleared, so no batch with ``key`` can exist
    before this create (the key names the run and the task), and no other attempt can make one:
    nothing is looked up, before or after it.
    """
    record = _load_record(checkpoint, chunk, log)
    if record and record.get("batch_id"):
        state = hook.get_state(record["batch_id"])
        if state.status not in _DEAD:
            log.info("%s: reattaching to batch %s (%s)", chunk["label"], state.batch_id, state.provider_status)
            submitted = _submitted(chunk, state.batch_id, record.get("input_file_id"), key, record, key_since)
            return {**submitted, "adopted_unproven": True} if record.get("adopted_unproven") else submitted
        log.warning("%s: batch %s from an earlier attempt ended %s; submitting a new one", chunk["label"],
                    state.batch_id, state.provider_status)  # fmt: skip
        record = {"fingerprint": chunk["fingerprint"], "input_file_id": record.get("input_file_id"),
                  **({"unsure_since": record["unsure_since"]} if record.get("unsure_since") else {})}  # fmt: skip

    # Always ask the provider before creating: a missing record may mean the store was cleared
    # ([state_store] clear_on_success) rather than "never submitted". Without an intent only a
    # stored key can find a batch (back to the run's start); a guess on size has nothing to go on.
    look_from = record or {"intent_at": key_since if hook.exact_reconcile else None}
    alone = record is None and first_try  # no earlier attempt of this key ever reached a create
    adopted = None if alone else _adopt(hook, chunk, key, look_from, log)
    if adopted is not None:
        proof = {"adopted_unproven": True} if adopted.get("adopted_unproven") else {}
        base = {**(record or {}), "fingerprint": chunk["fingerprint"], "batch_id": adopted["batch_id"]}
        checkpoint.save(base | proof)
        return adopted

    require_requests_file(chunk["requests_path"], chunk["label"])  # retention may have removed it
    extra_metadata = dict(prepare()) if prepare is not None else {}
    record = {**intent_record(hook, chunk, key), **(record or {})}
    checkpoint.save(record)  # the intent: from here on a retry must reconcile before submitting
    submitted, cancelled = _create(hook, chunk, {**metadata, **extra_metadata}, record, checkpoint, log, alone=alone)
    if metrics is not None:
        metrics.duplicates_cancelled(len(cancelled))
    return submitted


def _load_record(checkpoint: Checkpoint, chunk: ChunkDescriptor, log: Any) -> dict[str, Any] | None:
    """Return the chunk's checkpoint record (None: none, or one of another version of the chunk)."""
    record = checkpoint.load()
    if record and record.get("fingerprint") != chunk["fingerprint"]:
        log.info("%s: the chunk changed since the last attempt; its checkpoint is ignored", chunk["label"])
        return None
    if record and record.get("intent_at") and not record.get("batch_id"):
        # An earlier attempt meant to create and never learnt the outcome: its create may still land
        # (a slow proxy, a killed worker). jobs reconcile looks for such a batch from this time on.
        record["unsure_since"] = record.get("unsure_since") or record["intent_at"]
    return record


def intent_record(hook: BatchHook, chunk: ChunkDescriptor, key: str) -> dict[str, Any]:
    """Return what the checkpoint records before a create: enough for jobs reconcile to recognise the batch.

    Provider and request count let it match a batch that carries no key (Anthropic) to an unsure
    create of this chunk; the expected price per request says what a duplicate costs.
    """
    expected = chunk.get("cost_expected_usd")
    per_request = expected / chunk["num_requests"] if expected and chunk["num_requests"] else None
    return {
        "fingerprint": chunk["fingerprint"],
        "idempotency_key": key,
        "intent_at": time.time(),
        "provider": hook.provider,
        "conn_id": hook.conn_id,
        "num_requests": chunk["num_requests"],
        "usd_per_request": per_request,
    }


def _adopt(
    hook: BatchHook, chunk: ChunkDescriptor, key: str, record: Mapping[str, Any] | None, log: Any
) -> SubmittedBatch | None:
    """Return the live batch an earlier attempt made for ``key`` (None: there is none, create one).

    A batch is adopted when it is proven the chunk's own (:meth:`BatchHook.owns`; a stored key
    proves it), or provisionally when exactly one candidate cannot be told yet (a guess on size and
    time, still running): the sensor checks it when it ends and sends the chunk anew if it is
    another chunk's. A batch proven to be another chunk's is never adopted.
    """
    since = (record or {}).get("intent_at")
    file_id = (record or {}).get("input_file_id")
    existing = [s for s in hook.find_existing(key, chunk, since=since) if s.status not in _DEAD]
    verdicts = [(state, hook.owns(state, chunk)) for state in existing]
    own = [state for state, verdict in verdicts if verdict is True]
    unknown = [state for state, verdict in verdicts if verdict is None]
    if own:
        keep, *extra = own
        for dup in extra if hook.exact_reconcile else ():
            log.warning("%s: cancelling duplicate batch %s", chunk["label"], dup.batch_id)
            hook.cancel(dup.batch_id)
        log.info("%s: found batch %s created by an earlier attempt", chunk["label"], keep.batch_id)
        return _submitted(chunk, keep.batch_id, file_id, key, record)
    strangers = [state.batch_id for state, verdict in verdicts if verdict is False]
    if strangers:
        log.info("%s: recent batches %s match by size but hold other chunks' rows; not adopted", chunk["label"],
                 strangers)  # fmt: skip
    if len(unknown) == 1:
        log.warning("%s: batch %s may be this chunk's (it matches by size and time; it is still running); adopted "
                    "provisionally: checked when it ends, and this chunk is sent anew if it is another chunk's",
                    chunk["label"], unknown[0].batch_id)  # fmt: skip
        return {**_submitted(chunk, unknown[0].batch_id, file_id, key, record), "adopted_unproven": True}
    if unknown:
        log.warning("%s: %d running batches %s match by size and time; none can be proven this chunk's, so none "
                    "is adopted", chunk["label"], len(unknown), [s.batch_id for s in unknown])  # fmt: skip
    return None


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
    key_since: float | None = None,
) -> SubmittedBatch:
    """Create one extra batch for a task (a sensor's follow-up or resubmission), once per ``tag``.

    ``key_since``: the first batch's (its submission is older than any follow-up); see :func:`submit_once`.

    Checkpointed under ``checkpoint_key`` in the task state store and keyed by ``<task_id>.<tag>``
    at the provider, so a retry of the task reattaches to the batch instead of creating another.
    """
    dag, run_id, map_index = task_ids(context, dag_id)
    task = f"{task_id}.{tag}"
    key = idempotency_key(dag, run_id, task, map_index, chunk["fingerprint"])

    def prepare() -> dict[str, str]:
        if not hook.supports_token_budget:  # no budget to count against: no token metadata either
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
        key_since=key_since,
    )


def _create(
    hook: BatchHook,
    chunk: ChunkDescriptor,
    metadata: Mapping[str, str],
    record: dict[str, Any],
    checkpoint: Checkpoint,
    log: Any,
    *,
    alone: bool = False,
) -> tuple[SubmittedBatch, list[str]]:
    """Upload (unless done before) and create the batch; return it and the sibling batches cancelled after.

    ``alone``: no other attempt with this key exists (:func:`submit_once`'s ``first_try``), so none is looked for.
    """
    file_id = record.get("input_file_id")
    if file_id:
        log.info("%s: reusing uploaded file %s", chunk["label"], file_id)
    else:
        file_id = hook.upload_file(chunk["requests_path"], chunk_label=chunk["label"])
        if file_id is not None:  # a backend with an upload step: a retry reuses the uploaded file
            record = {**record, "input_file_id": file_id}
            checkpoint.save(record)
    batch_id = hook.create_batch(chunk, input_file_id=file_id, metadata=metadata)
    checkpoint.save({**record, "batch_id": batch_id})
    # Reconcile again: an orphaned attempt (its supervisor gone, its process alive) may still have
    # had a create in flight when this attempt looked, and it may have landed since. The orphan
    # itself never gets here: without its supervisor the checkpoint save above fails, so it cannot
    # cancel the batch of the attempt Airflow follows. On a run's first try there is no earlier try to
    # be that orphan, so the look is skipped: in a 1,000-chunk job it read ~3 list pages per chunk, the
    # most list calls of the run. (A create this try sent twice, its first answer lost, is found by the
    # create's own look-up before resending, and later by the sensor's first and last looks.)
    key = metadata.get(IDEMPOTENCY_METADATA_KEY) or ""
    look = key and not alone
    cancelled = cancel_siblings(hook, chunk, key, batch_id, since=record.get("intent_at"), log=log) if look else []
    return _submitted(chunk, batch_id, file_id, key, record), cancelled


def _submitted(
    chunk: ChunkDescriptor,
    batch_id: str,
    file_id: str | None,
    key: str,
    record: Mapping[str, Any] | None = None,
    key_since: float | None = None,
) -> SubmittedBatch:
    """Return the chunk with its batch; ``key_since``: no batch with ``key`` is older (None: not known)."""
    intent_at = (record or {}).get("intent_at")
    # The chunk's first intent when known: a live batch with the key is younger (an older one would have been
    # adopted); else the caller's bound.
    since = intent_at if isinstance(intent_at, int | float) else key_since
    return {**chunk, "batch_id": batch_id, "input_file_id": file_id, "idempotency_key": key, "key_since": since}


def cancel_siblings(
    hook: BatchHook, chunk: ChunkDescriptor, key: str, keep: str, *, since: float | None, log: Any
) -> list[str]:
    """Cancel every live batch with idempotency ``key`` except ``keep`` (the checkpointed one); return their ids.

    Only for backends whose :meth:`~BatchHook.find_existing` matches on a stored key
    (``exact_reconcile``): a guess must never cancel someone's batch. A sibling that already
    finished cannot be cancelled any more (it was billed): it is logged, not counted.
    """
    if not hook.exact_reconcile:
        return []
    found = hook.find_existing(key, chunk, since=since)
    return [state.batch_id for state in found if state.batch_id != keep and _cancel_live(hook, chunk, state, keep, log)]


def cancel_listed_siblings(
    hook: BatchHook, chunk: ChunkDescriptor, ids: list[str], keep: str, *, log: Any
) -> list[str]:
    """Cancel the batches ``ids`` that the triggerer's list named as ``keep``'s live siblings; return those cancelled.

    :func:`cancel_siblings` without the list call: each batch is looked at once more (it may have
    ended or been cancelled since the list) and cancelled only while it still runs.
    """
    if not hook.exact_reconcile:
        return []
    return [
        batch_id
        for batch_id in ids
        if batch_id != keep and _cancel_live(hook, chunk, hook.get_state(batch_id), keep, log)
    ]


def _cancel_live(hook: BatchHook, chunk: ChunkDescriptor, state: BatchState, keep: str, log: Any) -> bool:
    """Cancel ``state``'s batch, a sibling of ``keep``, if it still runs; return whether it was cancelled."""
    if state.status in _DEAD:
        return False
    if state.status.is_terminal:
        log.warning(
            "%s: batch %s has the same idempotency key as batch %s but already ended %s; it was billed, "
            "and its results are not used",
            chunk["label"],
            state.batch_id,
            keep,
            state.provider_status,
        )
        return False
    log.warning(
        "%s: cancelling batch %s: it has the same idempotency key as batch %s, which this task follows "
        "(a create from an earlier, orphaned attempt landed after this one looked)",
        chunk["label"],
        state.batch_id,
        keep,
    )
    hook.cancel(state.batch_id)
    return True
