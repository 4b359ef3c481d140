"""What the run report shows, gathered from the merge summary and each chunk's merge counters.

Kept apart from the drawing so the view, the report and the tests read the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.status import BatchState

if TYPE_CHECKING:
    from airflow_batch_provider.results.merge import MergeStats


@dataclass(frozen=True)
class AttemptTiming:
    """One provider batch of a chunk: its id, final status and when the provider created and ended it."""

    batch_id: str
    provider_status: str
    created_at: float | None
    ended_at: float | None
    completed: int
    failed: int
    total: int

    @property
    def latency_s(self) -> float | None:
        """Seconds from created to ended at the provider, when both are known."""
        if self.created_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.created_at)


@dataclass(frozen=True)
class ChunkReport:
    """One chunk's line in the report."""

    label: str
    chunk_index: int
    rows: int
    statuses: Mapping[str, int]
    failed: int
    retried_rows: int
    recovered_rows: int
    truncated_rows: int
    carried_rows: int
    attempts: tuple[AttemptTiming, ...] = ()

    @property
    def latency_s(self) -> float | None:
        """Seconds from the first batch's creation to the last batch's end (follow-ups included)."""
        starts = [a.created_at for a in self.attempts if a.created_at is not None]
        ends = [a.ended_at for a in self.attempts if a.ended_at is not None]
        if not starts or not ends:
            return None
        return max(0.0, max(ends) - min(starts))


@dataclass
class RunReport:
    """Everything the report page shows."""

    title: str
    summary: Mapping[str, Any]
    chunks: list[ChunkReport] = field(default_factory=list)

    @property
    def followup_batches(self) -> int:
        """Batches sent after a chunk's first one (line retries and resubmissions)."""
        return sum(max(0, len(c.attempts) - 1) for c in self.chunks)

    @property
    def started_at(self) -> float | None:
        """The earliest provider creation time of any batch (the timeline's zero)."""
        starts = [a.created_at for c in self.chunks for a in c.attempts if a.created_at is not None]
        return min(starts) if starts else None


def attempt_timing(state: BatchState) -> AttemptTiming:
    """Return the report's view of one batch state."""
    return AttemptTiming(
        batch_id=state.batch_id,
        provider_status=state.provider_status,
        created_at=state.created_at,
        ended_at=state.ended_at,
        completed=state.counts.completed,
        failed=state.counts.failed,
        total=state.counts.total,
    )


def chunk_report(batch: Mapping[str, Any], stats: MergeStats) -> ChunkReport:
    """Return one chunk's report line from its CompletedBatch record and its merge counters."""
    states = batch.get("attempts") or ([batch["state"]] if batch.get("state") else [])
    return ChunkReport(
        label=str(batch.get("label") or f"chunk {batch['chunk_index'] + 1}"),
        chunk_index=int(batch["chunk_index"]),
        rows=stats.rows,
        statuses=dict(stats.statuses),
        failed=stats.failed,
        retried_rows=stats.retried_rows,
        recovered_rows=stats.recovered_rows,
        truncated_rows=stats.truncated_rows,
        carried_rows=stats.carried_rows,
        attempts=tuple(attempt_timing(BatchState.from_dict(s)) for s in states),
    )


def build_report(
    title: str, summary: Mapping[str, Any], chunks: Sequence[tuple[Mapping[str, Any], MergeStats]]
) -> RunReport:
    """Return the report of one merge: the job summary plus one line per chunk, in chunk order."""
    lines = sorted((chunk_report(batch, stats) for batch, stats in chunks), key=lambda c: c.chunk_index)
    return RunReport(title=title, summary=summary, chunks=lines)
