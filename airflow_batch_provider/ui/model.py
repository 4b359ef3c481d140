"""What the "LLM batches" view shows for one DAG run, built from what the package records.

Sources, all small JSON in the metadata DB (never a request body or an answer):

- ChunkOperator's XCom: the chunk descriptors (every chunk is known from the start);
- SubmitBatchOperator's XCom: the batch id of each chunk;
- BatchCompleteSensor's ``llm_batch_progress`` XCom (:mod:`airflow_batch_provider.progress`): the
  last poll's provider status and counts; its checkpoint (task state store): every attempt so far;
  its XCom result: every attempt's final state;
- MergeResultsOperator's XCom: the job summary (statuses, tokens, costs, the report path).

:func:`build_run_view` is pure (plain records in, a :class:`RunView` out); :mod:`.queries` reads
the records from the database.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

CHUNK_OPERATOR = "ChunkOperator"
SUBMIT_OPERATOR = "SubmitBatchOperator"
SENSOR_OPERATOR = "BatchCompleteSensor"
MERGE_OPERATOR = "MergeResultsOperator"
OUR_OPERATORS = (CHUNK_OPERATOR, SUBMIT_OPERATOR, SENSOR_OPERATOR, MERGE_OPERATOR)
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


@dataclass
class ChunkRow:
    """One chunk's line in the view."""

    key: tuple[str, int]  # (job_dir, chunk_index)
    label: str
    num_requests: int
    phase: str = "waiting to be submitted"
    provider_status: str = ""
    completed: int = 0
    failed: int = 0
    total: int = 0
    batch_id: str = ""
    console_url: str = ""
    attempts: list[str] = field(default_factory=list)  # batch ids, first to last
    started: datetime | None = None
    ended: datetime | None = None
    submit_task: tuple[str, int] | None = None
    sensor_task: tuple[str, int] | None = None

    @property
    def followups(self) -> list[str]:
        """Batches sent after the first one (line retries, resubmissions)."""
        return self.attempts[1:]

    def elapsed_s(self, now: float) -> float | None:
        """Seconds from submission to the end of the wait (or to now while it runs)."""
        if self.started is None:
            return None
        end = self.ended.timestamp() if self.ended is not None else now
        return max(0.0, end - self.started.timestamp())

    def percent(self) -> tuple[float, float]:
        """Return (completed %, failed %) of the batch's requests, from the last poll."""
        if not self.total:
            return 0.0, 0.0
        return 100.0 * self.completed / self.total, 100.0 * self.failed / self.total


@dataclass
class RunView:
    """The view of one DAG run: a row per chunk plus the job totals."""

    dag_id: str
    run_id: str
    run_state: str
    chunks: list[ChunkRow] = field(default_factory=list)
    summary: Mapping[str, Any] | None = None  # the merge summary, once the merge ran
    merge_task: str | None = None  # the merge's task id (from the DB, not an XCom): where its report is
    estimated_cost_usd: float | None = None
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
    def completed(self) -> int:
        """Requests the provider reported completed at the last poll, over every chunk."""
        return sum(c.completed for c in self.chunks)

    @property
    def failed(self) -> int:
        """Requests the provider reported failed at the last poll, over every chunk."""
        return sum(c.failed for c in self.chunks)


def _int(value: Any) -> int:
    """Return ``value`` as a count; 0 for anything else (XComs are user data: a bad one must not break the page)."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _key(record: Mapping[str, Any]) -> tuple[str, int]:
    return str(record.get("job_dir") or ""), _int(record.get("chunk_index"))


def _row(rows: dict[tuple[str, int], ChunkRow], record: Mapping[str, Any]) -> ChunkRow:
    key = _key(record)
    if key not in rows:
        label = str(record.get("label") or f"chunk {key[1] + 1}")
        rows[key] = ChunkRow(key=key, label=label, num_requests=_int(record.get("num_requests")))
    return rows[key]


def _attempt_ids(sensor: TaskRecord) -> list[str]:
    states = sensor.result.get("attempts") if isinstance(sensor.result, Mapping) else None
    if states and isinstance(states, list):
        return [str(s.get("batch_id") or "") for s in states if isinstance(s, Mapping)]
    attempts = sensor.checkpoint.get("attempts") if isinstance(sensor.checkpoint, Mapping) else None
    return [str(a["batch_id"]) for a in attempts or () if isinstance(a, Mapping) and a.get("batch_id")]


def _apply_sensor(row: ChunkRow, sensor: TaskRecord) -> None:
    row.sensor_task = (sensor.task_id, sensor.map_index)
    row.phase = f"wait: {sensor.state or 'not started'}"
    progress = sensor.progress if isinstance(sensor.progress, Mapping) else {}
    if progress:
        row.provider_status = str(progress.get("provider_status") or "")
        row.completed, row.failed = _int(progress.get("completed")), _int(progress.get("failed"))
        row.total = _int(progress.get("total"))
        row.batch_id = str(progress.get("batch_id") or row.batch_id)
        row.console_url = str(progress.get("console_url") or row.console_url)
    row.attempts = _attempt_ids(sensor) or row.attempts
    if sensor.state not in LIVE_TI_STATES:
        row.ended = sensor.end_date


def _apply_submit(row: ChunkRow, submit: TaskRecord) -> None:
    row.submit_task = (submit.task_id, submit.map_index)
    row.phase = f"submit: {submit.state}"
    row.started = submit.start_date
    row.batch_id = str((submit.result or {}).get("batch_id") or "")
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
    if estimates and all(isinstance(v, int | float) for v in estimates):
        view.estimated_cost_usd = float(sum(estimates))
    return view
