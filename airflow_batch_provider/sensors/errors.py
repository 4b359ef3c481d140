"""The errors BatchCompleteSensor raises for batches that ended without usable results.

Each names the chunk (``label``) and the batch, carries the provider's line-level codes and
the batch state, and says what to do. An *expired* batch is not among them: what finished is
kept and what expired goes through the line retries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from airflow_batch_provider.exceptions import BatchCancelledError, BatchFailedError
from airflow_batch_provider.status import BatchState


def format_errors(errors: Sequence[dict[str, Any]], limit: int = 5) -> str:
    """Return the first ``limit`` provider errors as ``code (line N): message``, joined."""
    parts = []
    for err in list(errors)[:limit]:
        where = f" (line {err['line']})" if err.get("line") is not None else ""
        parts.append(f"{err.get('code')}{where}: {err.get('message')}")
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return "; ".join(parts) + more


def top_failures(counter: Counter[str], limit: int = 3) -> str:
    """Return the ``limit`` most common failure kinds with their counts, for a log line."""
    return ", ".join(f"{what} x{count:,}" for what, count in counter.most_common(limit))


def failed_error(label: str, state: BatchState) -> BatchFailedError:
    """Return the error for a batch the provider failed (validation), with its line-level codes."""
    detail = format_errors(state.errors)
    suffix = f": {detail}" if detail else ""
    return BatchFailedError(
        f"{label}: batch {state.batch_id} failed at the provider{suffix}",
        batch_id=state.batch_id,
        errors=state.errors,
        state=state.to_dict(),
    )


def cancelled_error(label: str, state: BatchState) -> BatchCancelledError:
    """Return the error for a batch someone else cancelled (a cancel is a decision: nothing is resent)."""
    detail = format_errors(state.errors)
    suffix = f": {detail}" if detail else ""
    return BatchCancelledError(
        f"{label}: batch {state.batch_id} was cancelled by someone else, not by this pipeline "
        f"({state.counts.completed} of {state.counts.total} requests done); nothing was resubmitted. "
        f"Check the provider console; clearing this task sends the lines again.{suffix}",
        batch_id=state.batch_id,
        errors=state.errors,
        state=state.to_dict(),
    )


def refused_error(label: str, state: BatchState, *, waited: float) -> BatchFailedError:
    """Return the error for a batch refused for the enqueued-token cap for longer than the sensor waits."""
    return BatchFailedError(
        f"{label}: the provider refused batch {state.batch_id} for its enqueued-token limit for "
        f"{waited:,.0f} s ({format_errors(state.errors)}). Lower chunk_size, set token_budget on "
        "SubmitBatchOperator, or raise token_limit_max_wait.",
        batch_id=state.batch_id,
        errors=state.errors,
        state=state.to_dict(),
    )
