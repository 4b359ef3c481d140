"""Live progress of each chunk's batch, published as a small XCom for the "LLM batches" view.

The sensor (each time it looks at its batch) and the trigger (each poll that changes the
counts) write one JSON record under :data:`PROGRESS_KEY` of the sensor's task instance: ids,
provider status, request counts and provider timestamps. Never a request or an answer.
XCom is what both a worker and the triggerer may write (the triggerer cannot write the task
state store), and what the api-server can read with the user's permissions. Publishing is
best effort: a failed write is logged and never fails the poll.

When an attempt's batch ends with failed lines, the sensor also publishes what it found in the
result files under ``llm_batch_errors.attempt-N`` (:func:`attempt_errors`): how many lines it
sends again, how many failed for good, and the top failure kinds with a few example custom_ids,
so the view can say what failed and what to do while the run is live, before the merge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.status import BatchState

if TYPE_CHECKING:
    from airflow_batch_provider.batches.line_retry import AttemptScan

log = logging.getLogger(__name__)

PROGRESS_KEY = "llm_batch_progress"
ERRORS_KEY = "llm_batch_errors"  # one XCom per scanned attempt: ERRORS_KEY + ".attempt-N"
STOPPED_KEY = "llm_batch_stopped"  # why a step refused to go on before anything was paid (the cost guard)
STOPPED_LIMIT = 2_000  # characters of the reason kept: the guard's message names its figures and what to do
MAX_KINDS = 5  # failure kinds kept per attempt (final ones first): the record stays a few hundred bytes


def errors_key(attempt: int) -> str:
    """Return the XCom key of attempt ``attempt``'s failure record."""
    return f"{ERRORS_KEY}.attempt-{attempt}"


def attempt_errors(state: BatchState, attempt: int, scan: AttemptScan) -> dict[str, Any]:
    """Return the failure record of an ended attempt: counts, and the top kinds with example custom_ids."""
    kinds = [
        {"kind": kind, "count": count, "final": final, "examples": list(scan.examples.get(kind, ()))}
        for counter, final in ((scan.final_failures, True), (scan.retryable, False))
        for kind, count in counter.most_common(MAX_KINDS)
    ]
    return {
        "attempt": attempt,
        "batch_id": state.batch_id,
        "total": state.counts.total,
        "resent": len(scan.retry_ids),
        "failed_final": scan.final_failed,
        "kinds": kinds[:MAX_KINDS],
    }


def publish_attempt_errors(context: Any, state: BatchState, attempt: int, scan: AttemptScan) -> None:
    """Push attempt ``attempt``'s failure record from the sensor (nothing when no line failed)."""
    if not scan.retry_ids and not scan.final_failures:
        return
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None:
        return
    try:
        ti.xcom_push(key=errors_key(attempt), value=attempt_errors(state, attempt, scan))
    except Exception as exc:  # like progress: for people watching, never a reason to fail the batch
        log.warning("could not publish the failures of batch %s: %s", state.batch_id, exc)


def progress_base(batch: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """Return the fields of a chunk's progress record that do not change between polls."""
    return {
        "job_dir": batch.get("job_dir"),
        "chunk_index": batch.get("chunk_index"),
        "label": batch.get("label"),
        "num_requests": batch.get("num_requests"),
        "first_batch_id": batch.get("batch_id"),
        "attempt": attempt,
    }


def progress_record(base: Mapping[str, Any], state: BatchState, console_url: str | None) -> dict[str, Any]:
    """Return the record to publish for ``state`` (one poll of the current attempt's batch)."""
    return {
        **base,
        "batch_id": state.batch_id,
        "console_url": console_url,
        "provider_status": state.provider_status,
        "status": state.status.value,
        "completed": state.counts.completed,
        "failed": state.counts.failed,
        "total": state.counts.total,
        "created_at": state.created_at,
        "ended_at": state.ended_at,
        "polled_at": time.time(),
    }


def publish_progress(context: Any, record: Mapping[str, Any]) -> None:
    """Push ``record`` from a running task (sensor ``execute``/``poke``); log, never raise, on failure."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None:
        return
    try:
        ti.xcom_push(key=PROGRESS_KEY, value=dict(record))
    except Exception as exc:  # progress is for people watching: it must never fail the batch
        log.warning("could not publish the progress of batch %s: %s", record.get("batch_id"), exc)


async def apublish_progress(task_instance: Any, record: Mapping[str, Any]) -> None:
    """Write ``record`` from the triggerer for the deferred task ``task_instance``; log, never raise."""
    if task_instance is None:  # a trigger run outside a triggerer (tests): nobody to show it to
        return
    try:
        from airflow.sdk.execution_time.xcom import XCom

        await XCom.aset(
            PROGRESS_KEY,
            dict(record),
            dag_id=task_instance.dag_id,
            task_id=task_instance.task_id,
            run_id=task_instance.run_id,
            map_index=task_instance.map_index,
        )
    except Exception as exc:
        log.warning("could not publish the progress of batch %s: %s", record.get("batch_id"), exc)


def publish_stopped(context: Any, reason: str, **about: Any) -> None:
    """Push why the task stops the run (e.g. the cost guard's message) for the view; log, never raise."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None:
        return
    try:
        ti.xcom_push(key=STOPPED_KEY, value={"reason": reason[:STOPPED_LIMIT], **about})
    except Exception as exc:  # the task fails with the reason anyway; this copy is for people watching
        log.warning("could not publish why the run stopped: %s", exc)
