"""Live progress of each chunk's batch, published as a small XCom for the "LLM batches" view.

The sensor (each time it looks at its batch) and the trigger (each poll that changes the
counts) write one JSON record under :data:`PROGRESS_KEY` of the sensor's task instance: ids,
provider status, request counts and provider timestamps. Never a request or an answer.
XCom is what both a worker and the triggerer may write (the triggerer cannot write the task
state store), and what the api-server can read with the user's permissions. Publishing is
best effort: a failed write is logged and never fails the poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.status import BatchState

log = logging.getLogger(__name__)

PROGRESS_KEY = "llm_batch_progress"


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
