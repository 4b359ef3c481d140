"""Gemini batch job states → :class:`~airflow_batch_provider.status.BatchStatus`, and which SDK errors to retry.

The Gemini Developer API reports ``BATCH_STATE_*``; the SDK turns them into ``JOB_STATE_*`` and
passes any state it does not know through unchanged, which :func:`map_gemini_state` refuses
rather than guessing (a new state could mean results are gone, or are still coming).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

from airflow_batch_provider.backends.gemini.limits import PROVIDER
from airflow_batch_provider.exceptions import UnknownBatchStatusError
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.utils.retry import retry_after_seconds

STATE_MAP: dict[str, BatchStatus] = {
    "JOB_STATE_PENDING": BatchStatus.VALIDATING,
    "JOB_STATE_QUEUED": BatchStatus.VALIDATING,
    "JOB_STATE_RUNNING": BatchStatus.IN_PROGRESS,
    "JOB_STATE_SUCCEEDED": BatchStatus.COMPLETED,
    "JOB_STATE_FAILED": BatchStatus.FAILED,
    "JOB_STATE_CANCELLING": BatchStatus.CANCELLING,
    # A cancel under way: the SDK has no JOB_STATE_ for this wire state and passes it through as is.
    "BATCH_STATE_CANCELLING": BatchStatus.CANCELLING,
    "JOB_STATE_CANCELLED": BatchStatus.CANCELLED,
    "JOB_STATE_EXPIRED": BatchStatus.EXPIRED,
}


def state_name(state: Any) -> str:
    """Return the state's name (``JOB_STATE_RUNNING``) from the SDK's enum member or a plain string."""
    if state is None:
        return ""
    return str(getattr(state, "value", state))


def map_gemini_state(state: Any, batch_id: str) -> BatchStatus:
    """Map a Gemini job state to :class:`BatchStatus`; raise on a state this provider does not know."""
    name = state_name(state)
    try:
        return STATE_MAP[name]
    except KeyError:
        raise UnknownBatchStatusError(
            f"Gemini batch {batch_id} reports state {name!r}, which this provider does not know "
            f"(known: {sorted(STATE_MAP)}). Upgrade airflow-batch-provider or report it."
        ) from None


#: A batch in one of these will never answer: not one a lost create could be adopted as.
DEAD = frozenset({BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.CANCELLING})


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return float(value.timestamp())


def counts_from_operation(operation: Any) -> RequestCounts:
    """Read ``metadata.batchStats`` of a batch's raw ``Operation`` JSON (int64 counts come as strings).

    The SDK's ``BatchJob`` leaves these counts out for the Developer API; line retries need them
    to notice lines with no result at all. Missing or malformed counts read as 0.
    """
    metadata = operation.get("metadata") if isinstance(operation, dict) else None
    stats = metadata.get("batchStats") if isinstance(metadata, dict) else None
    stats = stats if isinstance(stats, dict) else {}

    def number(key: str) -> int:
        try:
            return max(0, int(stats.get(key) or 0))
        except (TypeError, ValueError):
            return 0

    return RequestCounts(
        total=number("requestCount"), completed=number("successfulRequestCount"), failed=number("failedRequestCount")
    )


def with_operation(state: BatchState, operation: Any) -> BatchState:
    """Return ``state`` with the counts and the error of the batch's raw ``Operation`` JSON.

    The SDK's ``BatchJob`` drops both for the Developer API: a failed batch would say nothing of why.
    """
    error = operation.get("error") if isinstance(operation, dict) else None
    errors = state.errors
    if isinstance(error, dict) and error:
        errors = ({"code": error.get("code"), "message": str(error.get("message") or "")},)
    return replace(state, counts=counts_from_operation(operation), errors=errors)


def state_from_gemini(job: Any, *, counts: RequestCounts | None = None) -> BatchState:
    """Build a :class:`BatchState` from an SDK ``BatchJob`` (``counts`` from :func:`counts_from_operation`)."""
    status = map_gemini_state(job.state, job.name)
    dest = getattr(job, "dest", None)
    error = getattr(job, "error", None)
    errors: tuple[dict[str, Any], ...] = ()
    if error is not None:
        errors = ({"code": getattr(error, "code", None), "message": getattr(error, "message", None)},)
    return BatchState(
        batch_id=str(job.name),
        provider=PROVIDER,
        status=status,
        provider_status=state_name(job.state),
        counts=counts or RequestCounts(),
        output_file_id=getattr(dest, "file_name", None) if dest is not None else None,
        errors=errors,
        created_at=_epoch(job.create_time),
        ended_at=_epoch(job.end_time) if status.is_terminal else None,
        key=key_from_display_name(getattr(job, "display_name", None)),
    )


def key_from_display_name(name: str | None) -> str | None:
    """Return the idempotency key at the end of a display name, ``... [<key>]`` (None: it carries none)."""
    if not name or not name.endswith("]") or "[" not in name:
        return None
    return name[name.rindex("[") + 1 : -1] or None


def classify_gemini_error(exc: BaseException) -> tuple[bool, float | None]:
    """Say whether an SDK error is worth another attempt, and how long the server asked us to wait.

    ``google.genai.errors.APIError`` carries the HTTP status as ``code``; a broken connection is
    the transport's own error (httpx or httpx2, whichever the SDK runs on).
    """
    from google.genai import errors

    if isinstance(exc, errors.APIError):
        code = exc.code or 0
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        return code in (408, 409, 429) or code >= 500, retry_after_seconds(headers)
    name = type(exc).__module__.split(".")[0]
    if name in ("httpx", "httpx2", "aiohttp") and not isinstance(exc, ValueError):
        return True, None  # connection reset, timeout, protocol error while a file streams
    return isinstance(exc, ConnectionError | TimeoutError), None
