"""What the "LLM batches" view shows for one DAG run, built from what the package records.

Sources, all small JSON in the metadata DB (never a request body or an answer):

- ChunkOperator's XCom: the chunk descriptors (every chunk is known from the start);
- SubmitBatchOperator's XCom: the batch id of each chunk;
- BatchCompleteSensor's ``llm_batch_progress`` XCom (:mod:`airflow_batch_provider.progress`): the
  last poll's provider status and counts; its checkpoint (task state store): every attempt so far;
  its XCom result: every attempt's final state;
- the sensor's ``llm_batch_errors.attempt-N`` XComs: what each ended attempt's failed lines were
  (kinds, example row ids, how many were sent again);
- MergeResultsOperator's XCom: the job summary (statuses, tokens, costs, the report path).

A chunk's counts add up every batch it sent (the first one and its follow-ups), each line counted
once at its latest batch: succeeded, failed for good, being sent again, waiting, of the chunk's
requests. A chunk whose wait ended therefore shows done == its request count.

:func:`build_run_view` is pure (plain records in, a :class:`RunView` out); :mod:`.queries` reads
the records from the database.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_batch_provider.ui.errors import ErrorKind, from_attempts, from_summary, merge_kinds
from airflow_batch_provider.ui.values import UNREADABLE, count_or_zero, items, mapping, text, usd

CHUNK_OPERATOR = "ChunkOperator"
SUBMIT_OPERATOR = "SubmitBatchOperator"
SENSOR_OPERATOR = "BatchCompleteSensor"
MERGE_OPERATOR = "MergeResultsOperator"
OUR_OPERATORS = (CHUNK_OPERATOR, SUBMIT_OPERATOR, SENSOR_OPERATOR, MERGE_OPERATOR)
TOKEN_LIMIT_KIND = "refused/token_limit_exceeded: the provider's enqueued-token limit"
LIVE_TI_STATES = frozenset({"scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule"})


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
        """The chunk's requests (each counted once, however many batches it took)."""
        return self.num_requests

    @property
    def done(self) -> int:
        """Lines with their final result: succeeded or failed for good."""
        return self.succeeded + self.failed

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

    def percent(self) -> tuple[float, float, float]:
        """Return (succeeded %, failed %, being retried or judged %) of the chunk's requests."""
        if not self.total:
            return 0.0, 0.0, 0.0
        return (
            100.0 * self.succeeded / self.total,
            100.0 * self.failed / self.total,
            100.0 * (self.retrying + self.judging) / self.total,
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
    generated_at: float = field(default_factory=time.time)

    @property
    def live(self) -> bool:
        """Whether the run can still change (the page keeps refreshing)."""
        return self.run_state in ("queued", "running")

    @property
    def requests(self) -> int:
        """Requests of every chunk."""
        return sum(c.num_requests for c in self.chunks)

    @property
    def done(self) -> int:
        """Requests with their final result, over every chunk and batch."""
        return sum(c.done for c in self.chunks)

    @property
    def completed(self) -> int:
        """Requests that succeeded, over every chunk and batch (once merged, the rows the merge counts succeeded)."""
        if self.summary and "succeeded" in self.summary:
            return count_or_zero(self.summary.get("succeeded"))
        return sum(c.succeeded for c in self.chunks)

    @property
    def failed(self) -> int:
        """Requests that failed for good (or, once merged, rows the merge counts failed)."""
        if self.summary and "failed" in self.summary:
            return count_or_zero(self.summary.get("failed"))
        return sum(c.failed for c in self.chunks)

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


def _key(record: Mapping[str, Any]) -> tuple[str, int]:
    return text(record.get("job_dir")), count_or_zero(record.get("chunk_index"))


def _row(rows: dict[tuple[str, int], ChunkRow], record: Mapping[str, Any]) -> ChunkRow:
    key = _key(record)
    if key not in rows:
        label = text(record.get("label")) or f"chunk {key[1] + 1}"
        rows[key] = ChunkRow(key=key, label=label, num_requests=count_or_zero(record.get("num_requests")))
    return rows[key]


Attempts = list[tuple[str, Mapping[str, Any] | None]]  # (batch id, end state or None while it runs)


def _attempts(sensor: TaskRecord) -> Attempts:
    """Every attempt of the chunk: the sensor's result once it finished, else its checkpoint."""
    states = [s for s in items(mapping(sensor.result).get("attempts")) if isinstance(s, Mapping)]
    if states:
        return [(text(s.get("batch_id")), s) for s in states]
    found = [a for a in items(mapping(sensor.checkpoint).get("attempts")) if isinstance(a, Mapping)]
    if found:
        return [(text(a.get("batch_id")), mapping(a.get("state")) or None) for a in found]
    progress = mapping(sensor.progress)
    return [(text(progress.get("first_batch_id") or progress.get("batch_id")), None)] if progress else []


def _counts(record: Mapping[str, Any] | None, nested: bool) -> tuple[int, int, int]:
    """Return (total, completed, failed) of a BatchState dict (``nested``) or a progress record."""
    if record is None:
        return 0, 0, 0
    counts = mapping(record.get("counts")) if nested else record
    total, completed, failed = (count_or_zero(counts.get(name)) for name in ("total", "completed", "failed"))
    return total, completed, failed


def _live_attempt(progress: Mapping[str, Any], attempts: Attempts) -> int:
    """Return which attempt (1-based) the progress record is about (0: none)."""
    if not progress:
        return 0
    if "attempt" in progress:
        return count_or_zero(progress.get("attempt"))
    ids = [batch_id for batch_id, _ in attempts]
    batch_id = text(progress.get("batch_id"))
    return ids.index(batch_id) + 1 if batch_id in ids else len(attempts)


def _tally(row: ChunkRow, attempts: Attempts, progress: Mapping[str, Any], sensor: TaskRecord) -> None:
    """Count the chunk's lines over all its attempts, each line once, at its latest batch."""
    live = _live_attempt(progress, attempts)

    def counts(k: int) -> tuple[int, int, int]:  # attempt k (1-based): its end state, else the last poll of it
        state = attempts[k - 1][1]
        return _counts(state, True) if state is not None else _counts(progress if live == k else None, False)

    finished = sensor.state == "success"
    sent = row.num_requests  # the lines attempt k sent (attempt 1: the whole chunk)
    for k in range(1, len(attempts) + 1):
        total, ok, ko = counts(k)
        if k == 1 or not total:  # the lines we sent; a batch reports total 0 until it is validated
            total = sent or total
        row.succeeded += ok
        if k < len(attempts):  # a later attempt exists: what failed here was sent again or is final
            record = sensor.errors.get(k) or {}
            resent = count_or_zero(record["resent"]) if "resent" in record else (counts(k + 1)[0] or total - ok)
            row.failed += max(0, total - ok - resent)
            sent = resent
        elif attempts[k - 1][1] is not None and finished:
            row.failed += max(0, total - ok)
        else:  # running, or ended and being sorted by the sensor
            row.judging += ko
            row.retrying += max(0, total - ok - ko) if k > 1 else 0


def _apply_sensor(row: ChunkRow, sensor: TaskRecord) -> None:
    row.sensor_task = (sensor.task_id, sensor.map_index)
    row.phase = f"wait: {sensor.state or 'not started'}"
    progress = mapping(sensor.progress)
    if progress:
        row.provider_status = text(progress.get("provider_status"))
        row.console_url = text(progress.get("console_url"), 2048) or row.console_url
    attempts = _attempts(sensor)
    row.succeeded = row.failed = row.judging = row.retrying = 0
    _tally(row, attempts, progress, sensor)
    row.attempts = [batch_id for batch_id, _ in attempts if batch_id] or row.attempts
    row.batch_id = row.attempts[0] if row.attempts else row.batch_id
    row.errors = from_attempts(sensor.errors[k] for k in sorted(sensor.errors))
    wait = mapping(sensor.checkpoint).get("token_wait")
    if isinstance(wait, Mapping) and wait and sensor.state in LIVE_TI_STATES:
        row.phase = "wait: the provider's token budget is full; the same lines go again"
        row.errors.insert(0, ErrorKind(TOKEN_LIMIT_KIND, row.total - row.done, final=False))
    if sensor.state not in LIVE_TI_STATES:
        row.ended = sensor.end_date


def _apply_submit(row: ChunkRow, submit: TaskRecord) -> None:
    row.submit_task = (submit.task_id, submit.map_index)
    row.phase = f"submit: {submit.state}"
    row.started = submit.start_date
    row.batch_id = text(mapping(submit.result).get("batch_id"))
    row.attempts = row.attempts or ([row.batch_id] if row.batch_id else [])


def build_run_view(dag_id: str, run_id: str, run_state: str, tasks: Iterable[TaskRecord]) -> RunView:
    """Return the view of a run from its task records.

    The provider console link comes from the sensor's progress record (the hook that knows the
    console builds it on the worker), so a chunk gets its link at the sensor's first look.
    """
    view = RunView(dag_id=dag_id, run_id=run_id, run_state=run_state)
    rows: dict[tuple[str, int], ChunkRow] = {}
    tasks = list(tasks)
    estimates: list[Any] = []
    for task in tasks:
        if task.operator == CHUNK_OPERATOR and isinstance(task.result, list):
            for descriptor in (d for d in task.result if isinstance(d, Mapping)):
                _row(rows, descriptor)
                estimates.append(descriptor.get("cost_expected_usd"))
        elif task.operator == MERGE_OPERATOR:
            view.merge_task = view.merge_task or task.task_id
            if isinstance(task.result, Mapping):
                view.summary, view.merge_task = task.result, task.task_id
    # A submit still running has no result yet (its chunk is not known to be this map index).
    for task in (t for t in tasks if t.operator == SUBMIT_OPERATOR and isinstance(t.result, Mapping)):
        _apply_submit(_row(rows, task.result), task)
    for task in (t for t in tasks if t.operator == SENSOR_OPERATOR):
        progress = task.progress if isinstance(task.progress, Mapping) else None
        record = progress or (task.result if isinstance(task.result, Mapping) else None)
        if record:
            _apply_sensor(_row(rows, record), task)
    view.chunks = sorted(rows.values(), key=lambda r: r.key)
    view.estimated_cost_usd = _estimate(estimates)
    return view


def _estimate(values: list[Any]) -> float | str | None:
    """Return the run's expected cost: the chunks' sum; None when one is unpriced; UNREADABLE when one is no amount."""
    if not values or any(value is None for value in values):
        return None
    amounts = [usd(value) for value in values]
    return sum(a for a in amounts if a is not None) if None not in amounts else UNREADABLE
