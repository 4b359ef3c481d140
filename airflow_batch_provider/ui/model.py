"""What the "LLM batches" view shows for one DAG run, built from what the package records.

Sources, all small JSON in the metadata DB (never a request body or an answer):

- ChunkOperator's XCom: the chunk descriptors (every chunk is known from the start);
- SubmitBatchOperator's XCom: the batch id of each chunk;
- BatchCompleteSensor's ``llm_batch_progress`` XCom (:mod:`airflow_batch_provider.progress`): the
  last poll's provider status and counts; its checkpoint (task state store): every attempt so far;
  its XCom result: every attempt's final state;
- the sensor's ``llm_batch_errors.attempt-N`` XComs: what each ended attempt's failed lines were
  (kinds, example row ids, how many were sent again);
- a self-hosted generate task's XCom (ServerGenerateOperator, VLLMGenerateOperator): its chunk
  answered, as a completed batch;
- MergeResultsOperator's XCom: the job summary (statuses, tokens, costs, the report path) and each
  chunk's merged counts, which replace the provider's once the merge ran;
- ``llm_batch_stopped`` of any task: why it stopped the run before anything was paid (the cost guard).

A chunk's counts add up every batch it sent (the first one and its follow-ups), each line counted
once at its latest batch: succeeded, failed for good, being sent again, waiting, of the chunk's
requests. A chunk whose wait ended therefore shows done == its request count.

:func:`build_run_view` is pure (plain records in, a :class:`RunView` out); :mod:`.queries` reads
the records from the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow_batch_provider.progress import STOPPED_LIMIT
from airflow_batch_provider.ui.errors import ErrorKind, from_attempts
from airflow_batch_provider.ui.rows import ChunkRow, RunView, TaskRecord
from airflow_batch_provider.ui.values import UNREADABLE, count_or_zero, items, mapping, text, usd

__all__ = ["ChunkRow", "RunView", "TaskRecord", "build_run_view"]  # the rows live in .rows; imported from here too

CHUNK_OPERATOR = "ChunkOperator"
SUBMIT_OPERATOR = "SubmitBatchOperator"
SENSOR_OPERATOR = "BatchCompleteSensor"
MERGE_OPERATOR = "MergeResultsOperator"
# Self-hosted runs (operators/self_hosted.py): one task answers a chunk and returns it as a completed batch.
GENERATE_OPERATORS = ("ServerGenerateOperator", "VLLMGenerateOperator")
#: Task instances of these operators mark a DAG as one the view lists (a batch wait, or a self-hosted generate).
ANSWERING_OPERATORS = (SENSOR_OPERATOR, *GENERATE_OPERATORS)
OUR_OPERATORS = (CHUNK_OPERATOR, SUBMIT_OPERATOR, SENSOR_OPERATOR, MERGE_OPERATOR, *GENERATE_OPERATORS)
TOKEN_LIMIT_KIND = "refused/token_limit_exceeded: the provider's enqueued-token limit"
LIVE_TI_STATES = frozenset({"scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule"})


def _key(record: Mapping[str, Any]) -> tuple[str, int]:
    return text(record.get("job_dir")), count_or_zero(record.get("chunk_index"))


def _row(rows: dict[tuple[str, int], ChunkRow], record: Mapping[str, Any]) -> ChunkRow:
    key = _key(record)
    if key not in rows:
        label = text(record.get("label")) or f"chunk {key[1] + 1}"
        rows[key] = ChunkRow(key=key, label=label, num_requests=count_or_zero(record.get("num_requests")),
                             carried=count_or_zero(record.get("num_carried")))  # fmt: skip
    return rows[key]


def _apply_merge(rows: Iterable[ChunkRow], summary: Mapping[str, Any]) -> None:
    """Take each chunk's counts from the merge: the final word, the same figures as the run's totals."""
    merged = mapping(summary.get("chunk_counts"))  # results/summary.py chunk_counts
    job_dirs = [text(d) for d in items(merged.get("job_dirs"))]  # as the rows are keyed (_key)
    counts: dict[tuple[str, int], list[int]] = {}
    for entry in items(merged.get("chunks")):
        if isinstance(entry, list | tuple) and len(entry) == 5:
            where, index, *values = (count_or_zero(value) for value in entry)
            if where < len(job_dirs):
                counts[(job_dirs[where], index)] = values
    for row in rows:
        if row.key in counts:
            row.succeeded, row.failed, row.carried = counts[row.key]
            row.judging = row.retrying = 0
            row.merged = True


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


def _tally(row: ChunkRow, attempts: Attempts, progress: Mapping[str, Any], sensor: TaskRecord) -> int:
    """Count the chunk's lines over all its attempts, each line once, at its latest batch.

    Return how many lines of the last attempt failed for good once the wait ended (0 while it runs).
    """
    live = _live_attempt(progress, attempts)

    def counts(k: int) -> tuple[int, int, int]:  # attempt k (1-based): its end state, else the last poll of it
        state = attempts[k - 1][1]
        return _counts(state, True) if state is not None else _counts(progress if live == k else None, False)

    finished = sensor.state == "success"
    sent = row.num_requests  # the lines attempt k sent (attempt 1: the whole chunk)
    last_failed = 0
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
            last_failed = max(0, total - ok)
            row.failed += last_failed
        else:  # running, or ended and being sorted by the sensor
            row.judging += ko
            row.retrying += max(0, total - ok - ko) if k > 1 else 0
    return last_failed


def _final_kinds(kinds: list[ErrorKind], last_failed: int, last_recorded: bool) -> list[ErrorKind]:
    """Return a finished chunk's failure kinds: what failed for good, none still "sent again".

    A last attempt the sensor did not scan (no follow-up allowed any more) has no record of its
    own: its failed lines are the earlier attempts' retryable kind whose retries ran out.
    """
    final = [kind for kind in kinds if kind.final]
    if last_failed and not last_recorded:
        passing = [kind for kind in kinds if not kind.final]
        name = passing[0].kind if passing else "failed in the chunk's last batch"
        # No example ids: the earlier attempt's examples may be rows that succeeded when sent again.
        final.append(ErrorKind(f"{name} [retries used up]", last_failed, True))
    return sorted(final, key=lambda k: (-k.count, k.kind))


def _apply_sensor(row: ChunkRow, sensor: TaskRecord) -> None:
    row.sensor_task = (sensor.task_id, sensor.map_index)
    row.phase = f"wait: {sensor.state or 'not started'}"
    progress = mapping(sensor.progress)
    if progress:
        row.provider_status = text(progress.get("provider_status"))
        row.console_url = text(progress.get("console_url"), 2048) or row.console_url
    attempts = _attempts(sensor)
    row.succeeded = row.failed = row.judging = row.retrying = 0
    last_failed = _tally(row, attempts, progress, sensor)
    row.attempts = [batch_id for batch_id, _ in attempts if batch_id] or row.attempts
    row.batch_id = row.attempts[0] if row.attempts else row.batch_id
    row.errors = from_attempts(sensor.errors[k] for k in sorted(sensor.errors))
    if sensor.state == "success":
        row.errors = _final_kinds(row.errors, last_failed, len(attempts) in sensor.errors)
    wait = mapping(sensor.checkpoint).get("token_wait")
    if isinstance(wait, Mapping) and wait and sensor.state in LIVE_TI_STATES:
        row.phase = "wait: the provider's token budget is full; the same lines go again"
        row.errors.insert(0, ErrorKind(TOKEN_LIMIT_KIND, row.total - row.done, final=False))
    if sensor.state not in LIVE_TI_STATES:
        row.ended = sensor.end_date


def _apply_generate(rows: dict[tuple[str, int], ChunkRow], task: TaskRecord) -> None:
    """A self-hosted generate task: its result is the chunk's completed batch; it maps over the chunks in order."""
    result = mapping(task.result)
    # Still running (or failed): no result yet; map index i is chunk i of the chunk step's list.
    row = _row(rows, result) if result else next((r for r in rows.values() if r.key[1] == task.map_index), None)
    if row is None:
        return
    row.submit_task = row.sensor_task = (task.task_id, task.map_index)
    row.phase = f"generate: {task.state or 'not started'}"
    row.started, row.ended = task.start_date, task.end_date
    state = mapping(result.get("state"))
    if state:
        _, row.succeeded, row.failed = _counts(state, True)
        row.provider_status = text(state.get("provider_status"))
        row.batch_id = text(result.get("batch_id"))
        row.attempts = [row.batch_id] if row.batch_id else []


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
    backends = _read_plan(view, rows, tasks)
    # A submit still running has no result yet (its chunk is not known to be this map index).
    for task in (t for t in tasks if t.operator == SUBMIT_OPERATOR and isinstance(t.result, Mapping)):
        _apply_submit(_row(rows, task.result), task)
    for task in (t for t in tasks if t.operator == SENSOR_OPERATOR):
        progress = task.progress if isinstance(task.progress, Mapping) else None
        record = progress or (task.result if isinstance(task.result, Mapping) else None)
        if record:
            _apply_sensor(_row(rows, record), task)
    generated = [t for t in tasks if t.operator in GENERATE_OPERATORS]
    for task in generated:
        _apply_generate(rows, task)
    answered = [mapping(t.result) for t in generated if mapping(t.result)]
    if answered:  # the chunk step guessed a provider; the task that answered knows it
        backends = {_backend(result): None for result in answered}
    view.backends = [b for b in backends if b]
    if view.summary:
        _apply_merge(rows.values(), view.summary)
    view.chunks = sorted(rows.values(), key=lambda r: r.key)
    return view


def _read_plan(view: RunView, rows: dict[tuple[str, int], ChunkRow], tasks: list[TaskRecord]) -> dict[str, None]:
    """Read the chunk step's descriptors, the merge summary and why a task stopped the run; return the backends."""
    estimates: list[Any] = []
    backends: dict[str, None] = {}
    for task in tasks:
        if task.stopped:
            view.stopped = view.stopped or text(task.stopped.get("reason"), STOPPED_LIMIT)
            backends.setdefault(_backend(task.stopped))
        if task.operator == CHUNK_OPERATOR and isinstance(task.result, list):
            for descriptor in (d for d in task.result if isinstance(d, Mapping)):
                _row(rows, descriptor)
                estimates.append(descriptor.get("cost_expected_usd"))
                backends.setdefault(_backend(descriptor))
        elif task.operator == MERGE_OPERATOR:
            view.merge_task = view.merge_task or task.task_id
            if isinstance(task.result, Mapping):
                view.summary, view.merge_task = task.result, task.task_id
    view.estimated_cost_usd = _estimate(estimates)
    return backends


def _backend(record: Mapping[str, Any]) -> str:
    """Return "provider · model" of a chunk descriptor or completed batch ("" when it names neither)."""
    return " · ".join(part for part in (text(record.get("provider"), 40), text(record.get("model"), 80)) if part)


def _estimate(values: list[Any]) -> float | str | None:
    """Return the run's expected cost: the chunks' sum; None when one is unpriced; UNREADABLE when one is no amount."""
    if not values or any(value is None for value in values):
        return None
    amounts = [usd(value) for value in values]
    return sum(a for a in amounts if a is not None) if None not in amounts else UNREADABLE
