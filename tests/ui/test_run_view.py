"""The view's numbers over all of a chunk's batches, its failure kinds and next steps, and hostile XComs.

Pure: task records in, a RunView and its HTML out (the browser suite checks the same on a real run).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from airflow_batch_provider.batches.line_retry import AttemptScan
from airflow_batch_provider.progress import attempt_errors
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.ui.errors import next_step
from airflow_batch_provider.ui.model import TaskRecord, build_run_view
from airflow_batch_provider.ui.pages import run_content, runs_page

CHUNK = {"job_dir": "/j", "chunk_index": 0, "label": "chunk 1/1 (100 req)", "num_requests": 100}
INVALID = "errored/invalid_request_error: Invalid request (emulator fault invalid_line_rate)."
SERVER = "errored/server_error: The server had an error processing your request (emulated)."


def _state(batch_id: str, total: int, completed: int, failed: int, status: str = "completed") -> dict[str, Any]:
    counts = RequestCounts(total=total, completed=completed, failed=failed)
    return BatchState(batch_id, "openai", BatchStatus(status), status, counts).to_dict()


def _scan(final: int, retryable: int) -> AttemptScan:
    return AttemptScan(
        retry_ids=[f"r{i}" for i in range(retryable)],
        final_failures=Counter({INVALID: final}),
        retryable=Counter({SERVER: retryable}),
        examples={INVALID: ["row-7", "row-9", "row-42"], SERVER: ["r0", "r1", "r2"]},
    )


def _first_attempt_errors() -> dict[int, dict[str, Any]]:
    """What the sensor publishes for attempt 1: 100 sent, 90 answered well, 4 invalid, 6 server errors resent."""
    state = BatchState.from_dict(_state("b1", 100, 90, 10))
    return {1: attempt_errors(state, 1, _scan(final=4, retryable=6))}


def _view(sensor: TaskRecord, merge: dict[str, Any] | None = None, run_state: str = "running"):
    tasks = [
        TaskRecord(
            "chunk", -1, "ChunkOperator", "success", None, None, 1, result=[{**CHUNK, "cost_expected_usd": 0.5}]
        ),
        TaskRecord("submit", 0, "SubmitBatchOperator", "success", None, None, 1, result={**CHUNK, "batch_id": "b1"}),
        sensor,
    ]
    if merge is not None:
        tasks.append(TaskRecord("merge", -1, "MergeResultsOperator", "success", None, None, 1, result=merge))
    return build_run_view("d", "r", run_state, tasks)


def test_a_finished_chunk_counts_every_batch_once_not_only_its_last_follow_up():
    """The bug of issue 27: a 100-request chunk whose follow-up held 6 lines showed 6 / 0 / 6."""
    result = {**CHUNK, "batch_id": "b1", "attempts": [_state("b1", 100, 90, 10), _state("b2", 6, 6, 0)]}
    progress = {**CHUNK, "attempt": 2, "batch_id": "b2", "total": 6, "completed": 6, "failed": 0}
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "success", None, None, 1, result=result,
                        progress=progress, errors=_first_attempt_errors())  # fmt: skip
    (row,) = _view(sensor).chunks
    assert (row.done, row.total, row.succeeded, row.failed, row.retrying, row.waiting) == (100, 100, 96, 4, 0, 0)
    assert (row.batch_id, row.followups) == ("b1", ["b2"])
    invalid = row.errors[0]
    assert (invalid.kind, invalid.count, invalid.final) == (INVALID, 4, True)
    assert invalid.examples == ["row-7", "row-9", "row-42"]
    assert "fix these rows in the input" in invalid.hint


def test_a_live_follow_up_shows_what_is_being_retried_and_what_failed_before_the_merge():
    checkpoint = {"origin": "b1", "attempts": [{"batch_id": "b1", "state": _state("b1", 100, 90, 10)},
                                               {"batch_id": "b2"}]}  # fmt: skip
    progress = {**CHUNK, "attempt": 2, "batch_id": "b2", "total": 6, "completed": 2, "failed": 1}
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "deferred", None, None, 1, progress=progress,
                        checkpoint=checkpoint, errors=_first_attempt_errors())  # fmt: skip
    view = _view(sensor)
    (row,) = view.chunks
    assert (row.succeeded, row.failed, row.judging, row.retrying, row.done) == (92, 4, 1, 3, 96)
    assert view.retrying == 4 and view.failed == 4 and view.done == 96
    html = run_content(view, "/llm-batches")
    assert 'data-done="96"' in html and 'data-total="100"' in html
    assert "row-42" in html and "raise" not in next_step(SERVER, final=False)  # resent: nothing to do
    assert html.index("What failed, and what to do") > html.index('id="chunks"')


def test_the_first_batch_live_counts_what_the_provider_answered_so_far():
    progress = {**CHUNK, "attempt": 1, "batch_id": "b1", "total": 0, "completed": 0, "failed": 0}
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "deferred", None, None, 1, progress=progress,
                        checkpoint={"origin": "b1", "attempts": [{"batch_id": "b1"}]})  # fmt: skip
    (row,) = _view(sensor).chunks
    assert (row.done, row.waiting, row.total) == (0, 100, 100)  # total 0 before validation: the chunk's count
    progress.update(total=100, completed=40, failed=2)
    (row,) = _view(sensor).chunks
    assert (row.succeeded, row.judging, row.waiting, row.done) == (40, 2, 58, 40)


def test_after_the_merge_the_run_shows_the_merge_failures_and_the_actual_cost():
    merge = {"failed": 4, "top_errors": [[INVALID, 4]], "error_examples": {INVALID: ["row-7"]},
             "truncated_rows": 2, "truncated_examples": ["row-3"], "actual_cost_usd": 0.25}  # fmt: skip
    result = {**CHUNK, "batch_id": "b1", "attempts": [_state("b1", 100, 96, 4)]}
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "success", None, None, 1, result=result)
    view = _view(sensor, merge, run_state="success")
    assert [(k.count, k.examples) for k in view.errors] == [(4, ["row-7"]), (2, ["row-3"])]
    assert "raise max_tokens" in view.errors[1].hint
    assert view.cost_usd == (0.25, True)
    runs = runs_page([{"dag_id": "d", "run_id": "r", "state": "success", "start_date": None, "view": view}], "")
    assert "data-done='100'" in runs and "$0.2500" in runs and "<th>failed</th>" in runs


def test_hostile_xcom_values_are_escaped_and_odd_types_ignored():
    """An XCom is data: markup is escaped everywhere, wrong types count as nothing instead of failing the page."""
    evil = '<script>alert(1)</script>"'
    errors = {1: {"resent": "x", "kinds": [{"kind": evil, "count": "7", "final": True, "examples": [evil]}, "junk"]}}
    result = {**CHUNK, "label": evil, "batch_id": evil, "attempts": [{"batch_id": evil, "counts": "nope"}, 3]}
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "success", None, None, 1, result=result, errors=errors,
                        progress={**CHUNK, "label": evil, "console_url": "javascript:alert(1)", "attempt": "?"})  # fmt: skip
    view = _view(sensor)
    html = run_content(view, "/p")
    assert "<script>" not in html and "&lt;script&gt;" in html and "javascript:" not in html
    assert view.chunks[0].errors[0].count == 7


def test_next_steps_name_what_to_do_for_each_kind():
    assert "raise max_tokens" in next_step("truncated: answer cut off at max_tokens", True)
    assert "API key" in next_step("errored/authentication_error: bad key", True)
    assert "token budget" in next_step("refused/token_limit_exceeded: enqueued", False)
    assert "max_line_retries" in next_step(SERVER, True)
    assert "schema" in next_step("invalid_output/-: not JSON", True)


def test_the_sensor_publishes_each_attempts_failures_and_the_view_adds_them_up(openai_conn, openai_hook, tmp_path):
    """A real sensor on the emulator: invalid lines (final) and server errors (resent in follow-ups).

    What the sensor pushes (progress and one ``llm_batch_errors.attempt-N`` per scanned attempt) is all
    the view gets: built from it, the chunk is done with every line counted once, and the final
    failures carry row ids of this chunk.
    """
    from airflow_batch_provider.progress import ERRORS_KEY, PROGRESS_KEY
    from airflow_batch_provider.sensors.batch import BatchCompleteSensor
    from tests.support import make_context, write_chunk

    openai_conn.set_faults(seed=3, invalid_line_rate=0.1, line_error_rate=0.2)
    rows = [{"custom_id": f"p{i}", "text": f"x{i}"} for i in range(60)]
    submitted = openai_hook.submit(write_chunk(tmp_path, rows), metadata={})
    context = make_context()
    sensor = BatchCompleteSensor(task_id="wait", batch=submitted, poll_interval=0.05, deferrable=False)
    result = sensor.execute(context)
    pushed = context["ti"].pushed
    errors = {int(k.rsplit("-", 1)[1]): v for k, v in pushed if k.startswith(ERRORS_KEY)}
    progress = [v for k, v in pushed if k == PROGRESS_KEY][-1]
    assert 1 in errors and errors[1]["resent"] == result["attempts"][1]["counts"]["total"]
    record = TaskRecord("wait", 0, "BatchCompleteSensor", "success", None, None, 1, result=result,
                        progress=progress, errors=errors)  # fmt: skip
    view = build_run_view("d", "r", "running", [record])
    (row,) = view.chunks
    assert (row.done, row.total, row.retrying, row.judging) == (60, 60, 0, 0)
    assert row.followups and row.failed >= errors[1]["failed_final"] > 0
    invalid = next(k for k in row.errors if "invalid_request_error" in k.kind)
    assert invalid.final and invalid.examples and set(invalid.examples) <= {r["custom_id"] for r in rows}


def test_a_chunk_waiting_out_the_token_budget_says_so_and_what_to_do():
    """A `token_limit_exceeded` refusal: the sensor's checkpoint holds the wait; the view names it live."""
    checkpoint = {"origin": "b1", "attempts": [{"batch_id": "b1"}], "token_wait": {"since": 1.0, "resubmit_at": 9.0}}
    progress = {**CHUNK, "attempt": 1, "batch_id": "b1", "status": "failed", "total": 0, "completed": 0, "failed": 0}
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "deferred", None, None, 1, progress=progress,
                        checkpoint=checkpoint)  # fmt: skip
    (row,) = _view(sensor).chunks
    assert "token budget is full" in row.phase
    assert row.errors[0].count == 100 and not row.errors[0].final and "token budget" in row.errors[0].hint
    sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "success", None, None, 1, progress=progress,
                        checkpoint=checkpoint)  # fmt: skip
    assert not _view(sensor).chunks[0].errors  # over: no longer a reason to wait


def test_only_a_console_url_of_a_backend_template_becomes_a_link():
    """Issue 38 item 10: an XCom's ``console_url`` to any https host was a link on the page."""
    pages = {}
    for url in ("https://platform.openai.com/batches/batch_1", "https://evil.example/batches/batch_1",
                "https://platform.openai.com/batches/batch_1?u=https://evil.example"):  # fmt: skip
        progress = {**CHUNK, "attempt": 1, "batch_id": "batch_1", "total": 100, "console_url": url}
        sensor = TaskRecord("wait", 0, "BatchCompleteSensor", "deferred", None, None, 1, progress=progress)
        pages[url] = run_content(_view(sensor), "/p")
    linked = [url for url, html in pages.items() if 'class="console"' in html]
    assert linked == ["https://platform.openai.com/batches/batch_1"]
    assert "evil.example" not in pages["https://evil.example/batches/batch_1"]
