"""The records the "LLM batches" view reads and the rows it shows: a task instance, a chunk, a run.

:mod:`.model` builds them from the task records (:mod:`.queries` loads those); :mod:`.tables` and
:mod:`.pages` draw them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_batch_provider.ui.errors import ErrorKind, from_summary, merge_kinds
from airflow_batch_provider.ui.values import count_or_zero, mapping


@dataclass(frozen=True)
class TaskRecord:
    """One task instance of the run, with its XComs and checkpoint (what :mod:`.queries` loads)."""

    task_id: str
    map_index: int
    operator: str
    state: str | None
    start_date: datetime | None
    end_date: datetime | None
    try_number: int
    result: Any = None  # XCom return_value
    progress: Mapping[str, Any] | None = None  # XCom llm_batch_progress (sensor)
    checkpoint: Mapping[str, Any] | None = None  # task state store "batch_wait" (sensor)
    errors: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)  # attempt -> llm_batch_errors record
    stopped: Mapping[str, Any] | None = None  # XCom llm_batch_stopped: why the task stopped the run (cost guard)


@dataclass
class ChunkRow:
    """One chunk's line in the view: its lines by where they are now, over all its batches."""

    key: tuple[str, int]  # (job_dir, chunk_index)
    label: str
    num_requests: int
    phase: str = "waiting to be submitted"
    provider_status: str = ""
    succeeded: int = 0
    failed: int = 0  # failed for good (not sent again)
    judging: int = 0  # failed in a batch whose failures the sensor has not sorted yet
    retrying: int = 0  # in a follow-up batch, not answered yet
    carried: int = 0  # unchanged rows whose stored result an earlier run paid for (skip_unchanged): not sent
    merged: bool = False  # succeeded/failed are the merge's counts (carried rows included), not the provider's
    batch_id: str = ""  # the first batch
    console_url: str = ""
    attempts: list[str] = field(default_factory=list)  # batch ids, first to last
    started: datetime | None = None
    ended: datetime | None = None
    submit_task: tuple[str, int] | None = None
    sensor_task: tuple[str, int] | None = None
    errors: list[ErrorKind] = field(default_factory=list)

    @property
    def followups(self) -> list[str]:
        """Batches sent after the first one (line retries, resubmissions)."""
        return self.attempts[1:]

    @property
    def total(self) -> int:
        """The chunk's rows: its requests (each counted once, however many batches it took) and carried rows."""
        return self.num_requests + self.carried

    @property
    def done(self) -> int:
        """Rows with their final result: succeeded or failed for good, or carried from an earlier run."""
        return self.succeeded + self.failed + (0 if self.merged else self.carried)

    @property
    def waiting(self) -> int:
        """Lines of the first batch not answered yet."""
        return max(0, self.total - self.done - self.judging - self.retrying)

    def elapsed_s(self, now: float) -> float | None:
        """Seconds from submission to the end of the wait (or to now while it runs)."""
        if self.started is None:
            return None
        end = self.ended.timestamp() if self.ended is not None else now
        return max(0.0, end - self.started.timestamp())

    def percent(self) -> tuple[float, float, float, float]:
        """Return (succeeded %, failed %, being retried or judged %, carried %) of the chunk's rows."""
        if not self.total:
            return 0.0, 0.0, 0.0, 0.0
        # Once merged, carried rows are inside the merge's counts: drawn as carried, taken from succeeded.
        carried = min(self.carried, self.succeeded) if self.merged else self.carried
        return (
            100.0 * (self.succeeded - (carried if self.merged else 0)) / self.total,
            100.0 * self.failed / self.total,
            100.0 * (self.retrying + self.judging) / self.total,
            100.0 * carried / self.total,
        )


@dataclass
class RunView:
    """The view of one DAG run: a row per chunk plus the job totals."""

    dag_id: str
    run_id: str
    run_state: str
    chunks: list[ChunkRow] = field(default_factory=list)
    summary: Mapping[str, Any] | None = None  # the merge summary, once the merge ran
    merge_task: str | None = None  # the merge's task id (from the DB, not an XCom): where its report is
    estimated_cost_usd: float | str | None = None  # None: a chunk is unpriced; UNREADABLE: one is no amount
    backends: list[str] = field(default_factory=list)  # "provider · model" of the chunks (self-hosted: server, vllm)
    stopped: str = ""  # why a task stopped the run before anything was paid (the cost guard's message)
    generated_at: float = field(default_factory=time.time)

    @property
    def live(self) -> bool:
        """Whether the run can still change (the page keeps refreshing)."""
        return self.run_state in ("queued", "running")

    @property
    def requests(self) -> int:
        """Rows of every chunk: requests, and rows carried from an earlier run."""
        return sum(c.total for c in self.chunks)

    @property
    def carried(self) -> int:
        """Rows carried from an earlier run (skip_unchanged): not sent, paid for by that run."""
        return sum(c.carried for c in self.chunks)

    @property
    def done(self) -> int:
        """Requests with their final result, over every chunk and batch."""
        return sum(c.done for c in self.chunks)

    @property
    def completed(self) -> int:
        """Rows that succeeded: the chunk lines' sum (once merged, the merge's counts), so both always agree."""
        if self._summary_counts:
            return count_or_zero(mapping(self.summary).get("succeeded"))
        return sum(c.succeeded for c in self.chunks)

    @property
    def failed(self) -> int:
        """Rows that failed for good: the chunk lines' sum (once merged, the merge's counts)."""
        if self._summary_counts:
            return count_or_zero(mapping(self.summary).get("failed"))
        return sum(c.failed for c in self.chunks)

    @property
    def _summary_counts(self) -> bool:
        """Whether only the merge summary's totals are final (a merge from before it listed chunk counts)."""
        merged = mapping(self.summary)
        return bool(merged) and "succeeded" in merged and not any(c.merged for c in self.chunks)

    def percent(self) -> tuple[float, float, float, float]:
        """Return (succeeded %, failed %, being retried or judged %, carried %) of the run's rows."""
        total = self.requests
        if not total:
            return 0.0, 0.0, 0.0, 0.0
        merged = any(c.merged for c in self.chunks)  # carried rows are inside the merge's succeeded
        carried = min(self.carried, self.completed) if merged else self.carried
        parts = (self.completed - (carried if merged else 0), self.failed, self.retrying, carried)
        ok, ko, retry, kept = (100.0 * value / total for value in parts)
        return ok, ko, retry, kept

    @property
    def retrying(self) -> int:
        """Requests being sent again (or failed in a batch the sensor has not sorted yet)."""
        return sum(c.retrying + c.judging for c in self.chunks)

    @property
    def errors(self) -> list[ErrorKind]:
        """The run's top failure kinds: the merge's once it ran, else the chunks' so far."""
        if self.summary:
            return from_summary(self.summary)
        return merge_kinds(c.errors for c in self.chunks)

    @property
    def cost_usd(self) -> tuple[Any, bool]:
        """Return (cost, actual): the merge's actual batch cost once known, else the estimate (for ``show_usd``)."""
        actual = mapping(self.summary).get("actual_cost_usd")
        if actual is not None:
            return actual, True
        return self.estimated_cost_usd, False
