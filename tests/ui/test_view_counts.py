"""The view's counts as a new user reads them (issue 38 items 1 and 2): one source of truth, final failures
listed, carried rows shown, next steps that work. Pure: task records in, a RunView and its HTML out."""

from __future__ import annotations

import re

from airflow_batch_provider.progress import attempt_errors
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.ui.errors import next_step
from airflow_batch_provider.ui.model import TaskRecord, build_run_view
from airflow_batch_provider.ui.pages import _STYLE as PAGE_STYLE
from airflow_batch_provider.ui.pages import run_content, runs_page
from airflow_batch_provider.ui.tables import STYLE as TABLE_STYLE
from tests.ui.test_run_view import CHUNK, INVALID, SERVER, _scan, _state, _view


def _retries_ran_out() -> TaskRecord:
    """100 sent: 90 fine, 4 invalid for good, 6 server errors sent again; the follow-up (the last one allowed)
    answered 4 of the 6. The sensor scans no attempt after the last follow-up: attempt 2 has no record."""
    first = BatchState.from_dict(_state("b1", 100, 90, 10))
    result = {**CHUNK, "batch_id": "b1", "attempts": [_state("b1", 100, 90, 10), _state("b2", 6, 4, 2)]}
    return TaskRecord("wait", 0, "BatchCompleteSensor", "success", None, None, 1, result=result,
                      errors={1: attempt_errors(first, 1, _scan(final=4, retryable=6))})  # fmt: skip


def test_rows_whose_retries_ran_out_are_listed_as_final_failures():
    view = _view(_retries_ran_out(), run_state="success")
    (row,) = view.chunks
    assert (row.succeeded, row.failed, row.done) == (94, 6, 100)
    kinds = {(k.kind, k.count, k.final) for k in row.errors}
    assert kinds == {(INVALID, 4, True), (f"{SERVER} [retries used up]", 2, True)}
    assert sum(k.count for k in row.errors) == row.failed
    html = run_content(view, "/p")
    assert "nothing to do" not in html and "sent again in a follow-up" not in html
    assert "max_line_retries" in next_step(f"{SERVER} [retries used up]", final=True)


def test_once_merged_the_tiles_and_the_chunk_lines_show_the_same_counts():
    """The merge also fails answers the provider counted completed (cut off): 384 vs 381 in the issue."""
    merged = {"job_dirs": ["/j"], "chunks": [[0, 0, 91, 9, 0]]}  # results/summary.py chunk_counts
    merge = {"rows": 100, "succeeded": 91, "failed": 9, "statuses": {"succeeded": 91, "errored": 6, "invalid_output": 3},
             "top_errors": [[INVALID, 4]], "chunk_counts": merged, "actual_cost_usd": 0.1}  # fmt: skip
    view = _view(_retries_ran_out(), merge, run_state="success")
    (row,) = view.chunks
    assert (row.succeeded, row.failed, row.done) == (91, 9, 100)
    assert (view.completed, view.failed, view.done) == (91, 9, 100)
    html = run_content(view, "/p")
    assert 'data-testid="total-failed"><b>9<' in html and 'data-failed="9"' in html
    labels = re.findall(r'data-testid="[^"]+"><b>[^<]*</b>([^<]+)</div>', html)
    assert len(labels) == len(set(labels)) and "succeeded" in labels and "rows succeeded" not in labels


def test_a_rerun_that_carried_every_row_shows_them_carried_not_an_empty_bar():
    carried = {**CHUNK, "num_requests": 0, "num_carried": 100, "label": "chunk 1/1 (0 req, 100 unchanged)"}
    merged = {"job_dirs": ["/j"], "chunks": [[0, 0, 100, 0, 100]]}
    merge = {"rows": 100, "succeeded": 100, "failed": 0, "carried_rows": 100, "chunk_counts": merged,
             "actual_cost_usd": 0.0}  # fmt: skip
    for summary, state in ((None, "running"), (merge, "success")):
        tasks = [TaskRecord("chunk", -1, "ChunkOperator", "success", None, None, 1, result=[carried])]
        if summary:
            tasks.append(TaskRecord("merge", -1, "MergeResultsOperator", "success", None, None, 1, result=summary))
        view = build_run_view("d", "r", state, tasks)
        assert (view.requests, view.done, view.carried) == (100, 100, 100)
        runs = runs_page([{"dag_id": "d", "run_id": "r", "state": state, "start_date": None, "view": view}], "")
        assert "0 / 0" not in runs and "100 / 100 <span class='carried'>(100 carried)</span>" in runs
        assert '<rect class="carried" x="0.00" y="0" width="100.00"' in runs


def test_next_steps_say_what_really_sends_a_row_again():
    """A chunk's batch is tied to its content: clearing its submit task cannot send fixed rows."""
    invalid = next_step(INVALID, final=True)
    assert "submit task" not in invalid and "run the DAG again" in invalid and "skip_unchanged" in invalid
    truncated = next_step("truncated: answer cut off at max_tokens", final=True)
    assert "raise max_tokens" in truncated and "sends every row again" in truncated


def test_only_ids_in_code_may_break_anywhere_headers_and_words_never():
    """In the DAG-run tab headers and batch ids broke mid-word: `overflow-wrap:anywhere` was on every cell."""
    rules = dict(
        (selector.strip(), body) for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", TABLE_STYLE + PAGE_STYLE)
    )
    anywhere = [selector for selector, body in rules.items() if "anywhere" in body or "break-all" in body]
    assert anywhere and all(selector.endswith("code") for selector in anywhere), anywhere
    assert "overflow-wrap:normal" in rules["table.fit th"] and "hyphens:manual" in rules["table.fit th"]
    assert "overflow-wrap:break-word" in rules["table.fit td"]  # a long word wraps only when it must
