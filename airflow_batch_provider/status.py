"""Provider-neutral batch status and the state snapshot every hook returns.

Each provider hook maps its own status strings to :class:`BatchStatus` in exactly one
function, which raises :class:`~airflow_batch_provider.exceptions.UnknownBatchStatusError`
for a status it does not know.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class BatchStatus(enum.StrEnum):
    """Provider-neutral lifecycle of a batch."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """Return True when the batch can no longer change."""
        return self in TERMINAL_STATUSES


INTERMEDIATE_STATUSES = frozenset(
    {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING}
)
FAILURE_STATUSES = frozenset({BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
TERMINAL_STATUSES = frozenset({BatchStatus.COMPLETED}) | FAILURE_STATUSES


@dataclass(frozen=True)
class RequestCounts:
    """Request counters reported by the provider for one batch."""

    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchState:
    """A snapshot of one batch at the provider, small enough for XCom and trigger events."""

    batch_id: str
    provider: str
    status: BatchStatus
    provider_status: str
    counts: RequestCounts = field(default_factory=RequestCounts)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: tuple[dict[str, Any], ...] = ()
    results_url: str | None = None
    # Provider-reported epoch seconds: when the batch was created and when it reached a terminal
    # status (None while it runs). The run report's latency timeline is drawn from these.
    created_at: float | None = None
    ended_at: float | None = None
    # The idempotency key the provider stores on the batch (OpenAI metadata, Gemini display name);
    # None where the backend stores none. Lets the triggerer's shared list name a chunk's siblings.
    key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (for XCom and trigger events)."""
        data = asdict(self)
        data["status"] = self.status.value
        data["errors"] = [dict(e) for e in self.errors]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchState:
        """Rebuild a state from :meth:`to_dict` output."""
        return cls(
            batch_id=data["batch_id"],
            provider=data["provider"],
            status=BatchStatus(data["status"]),
            provider_status=data["provider_status"],
            counts=RequestCounts(**(data.get("counts") or {})),
            output_file_id=data.get("output_file_id"),
            error_file_id=data.get("error_file_id"),
            errors=tuple(data.get("errors") or ()),
            results_url=data.get("results_url"),
            created_at=data.get("created_at"),
            ended_at=data.get("ended_at"),
            key=data.get("key"),
        )

    def progress_line(self) -> str:
        """Return a one-line human summary for logs."""
        c = self.counts
        return (
            f"batch {self.batch_id}: {self.provider_status} "
            f"(completed {c.completed}, failed {c.failed}, total {c.total})"
        )
