"""What the OpenAI Batch API's answers mean: its statuses, its errors, and a batch as a :class:`BatchState`.

Kept apart from the hook so that code which only reads answers (the OpenAI-compatible hook's error
handling, the status tests) needs no connection, and the hook stays one concern.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai

from airflow_batch_provider.exceptions import UnknownBatchStatusError
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.utils.retry import retry_after_seconds

_STATUS_MAP: dict[str, BatchStatus] = {
    "validating": BatchStatus.VALIDATING,
    "in_progress": BatchStatus.IN_PROGRESS,
    "finalizing": BatchStatus.FINALIZING,
    "completed": BatchStatus.COMPLETED,
    "failed": BatchStatus.FAILED,
    "expired": BatchStatus.EXPIRED,
    "cancelling": BatchStatus.CANCELLING,
    "cancelled": BatchStatus.CANCELLED,
}


def map_openai_status(status: str | None, batch_id: str) -> BatchStatus:
    """Map an OpenAI batch status to :class:`BatchStatus`; raise on a status we do not know."""
    try:
        return _STATUS_MAP[status or ""]
    except KeyError:
        raise UnknownBatchStatusError(
            f"OpenAI batch {batch_id} reports status {status!r}, which this provider does not know "
            f"(known: {sorted(_STATUS_MAP)}). Upgrade airflow-batch-provider or report it."
        ) from None


def classify_openai_error(exc: BaseException) -> tuple[bool, float | None]:
    """Say whether an SDK error is worth another attempt, and how long the server asked us to wait.

    A connection that breaks while a result file is streaming surfaces as the transport's own
    error (``httpx2.TransportError``), not the SDK's: it is retryable too.
    """
    if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):  # includes timeouts
        return True, None
    if isinstance(exc, openai.APIStatusError):
        retryable = exc.status_code in (408, 409, 429) or exc.status_code >= 500
        return retryable, retry_after_seconds(exc.response.headers)
    return False, None


def state_from_openai(batch: Any, provider: str = "openai") -> BatchState:
    """Build a :class:`BatchState` from an SDK ``Batch`` object (``provider``: a variant's own name, e.g. azure)."""
    counts = batch.request_counts
    errors: tuple[dict[str, Any], ...] = ()
    if batch.errors is not None and batch.errors.data:
        errors = tuple(
            {"code": e.code, "line": e.line, "message": e.message, "param": e.param} for e in batch.errors.data
        )
    return BatchState(
        batch_id=batch.id,
        provider=provider,
        status=map_openai_status(batch.status, batch.id),
        provider_status=batch.status,
        counts=RequestCounts(
            total=counts.total if counts else 0,
            completed=counts.completed if counts else 0,
            failed=counts.failed if counts else 0,
        ),
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        errors=errors,
        created_at=float(batch.created_at) if batch.created_at else None,
        ended_at=_ended_at(batch),
        key=_key(batch),
    )


def _key(batch: Any) -> str | None:
    """Return the idempotency key our submit stored in the batch's metadata (None: not one of ours)."""
    key = (getattr(batch, "metadata", None) or {}).get(IDEMPOTENCY_METADATA_KEY)
    return str(key) if key else None


def _ended_at(batch: Any) -> float | None:
    """Return when an OpenAI batch reached its terminal status (epoch seconds), or None while it runs."""
    for name in ("completed_at", "failed_at", "expired_at", "cancelled_at"):
        value = getattr(batch, name, None)
        if value:
            return float(value)
    return None


_DEAD = frozenset({BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.CANCELLING})


def is_dead(state: BatchState) -> bool:
    return state.status in _DEAD
