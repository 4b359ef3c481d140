"""The emulator's stored objects (files, OpenAI batches, Anthropic message batches) and their JSON views."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_batch_emulator.faults import Faults

log = logging.getLogger("airflow_batch_emulator")

DAY = 24 * 3600
OPENAI_ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
OPENAI_TERMINAL = ("completed", "failed", "expired", "cancelled")


def rfc3339(epoch: float | None) -> str | None:
    """Format a Unix time as an RFC 3339 UTC string (None stays None)."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class StoredFile:
    """An uploaded or generated OpenAI file, held in memory."""

    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int
    expires_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the FileObject JSON."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.expires_at,
            "status_details": None,
        }


@dataclass
class OpenAIBatch:
    """One OpenAI batch: its public fields plus the worker's progress through the input lines."""

    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    created_at: int
    faults: Faults
    request_count_hint: int
    output_expires_after: int | None = None
    max_lines: int = 50_000  # requests one input file may hold (the API that created it decides)
    status: str = "validating"
    times: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    errors: list[dict[str, Any]] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    # Worker state.
    due: float = 0.0
    phase_start: float = 0.0
    lines: list[bytes] = field(default_factory=list)
    cursor: int = 0
    out: list[bytes] = field(default_factory=list)
    err: list[bytes] = field(default_factory=list)
    expired: int = 0
    enqueued_tokens: int = 0
    cancel_at_line: int | None = None
    polls: int = 0  # status retrieves (GET /v1/batches/{id}) so far
    held: str | None = None  # see OpenAIRunner.conclude: a finished batch waiting for polls_before_done

    def set_status(self, status: str, now: float) -> None:
        """Move to ``status``, stamp ``<status>_at`` and log the change."""
        log.info("openai batch %s: %s -> %s", self.id, self.status, status)
        self.status = status
        self.times[f"{status}_at"] = int(now)

    def to_json(self) -> dict[str, Any]:
        """Return the Batch JSON with every documented field."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.created_at + DAY,
        }
        for name in ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"):
            body[f"{name}_at"] = self.times.get(f"{name}_at")
        body["request_counts"] = {"total": self.total, "completed": self.completed, "failed": self.failed}
        body["usage"] = {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }
        body["metadata"] = self.metadata
        return body


@dataclass
class AnthropicBatch:
    """One Anthropic message batch: its public fields plus the worker's progress."""

    id: str
    created_at: float
    faults: Faults
    requests: list[tuple[str, Any]]
    results_url: str
    status: str = "in_progress"
    ended_at: float | None = None
    cancel_initiated_at: float | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"succeeded": 0, "errored": 0, "canceled": 0, "expired": 0})
    # Worker state.
    due: float = 0.0
    phase_start: float = 0.0
    cursor: int = 0
    results: list[bytes] = field(default_factory=list)
    results_blob: bytes | None = None
    cancel_at_line: int | None = None
    polls: int = 0  # status retrieves (GET /v1/messages/batches/{id}) so far
    held: str | None = None  # see AnthropicRunner.conclude: a finished batch waiting for polls_before_done

    def set_status(self, status: str, now: float) -> None:
        """Move to ``status`` and log the change."""
        log.info("anthropic batch %s: %s -> %s", self.id, self.status, status)
        self.status = status
        if status == "canceling":
            self.cancel_initiated_at = now
        elif status == "ended":
            self.ended_at = now

    def to_json(self) -> dict[str, Any]:
        """Return the MessageBatch JSON; counts move out of ``processing`` only once ended (as the API does)."""
        ended = self.status == "ended"
        counts = dict(self.counts) if ended else {"succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        counts["processing"] = 0 if ended else len(self.requests)
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": counts,
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.created_at + DAY),
            "ended_at": rfc3339(self.ended_at),
            "cancel_initiated_at": rfc3339(self.cancel_initiated_at),
            "archived_at": None,
            "results_url": self.results_url if ended else None,
        }
