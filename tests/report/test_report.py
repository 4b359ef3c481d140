"""The run report: written by the merge next to its output, self-contained, with the summary's own figures."""

from __future__ import annotations

import json
import re

from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.report import REPORT_FILE
from tests.conftest import wait_terminal
from tests.support import chat_line, make_context, write_chunk


def _rows(n: int, start: int = 0):
    return [{"custom_id": f"r{i}", "text": f"item {i}"} for i in range(start, start + n)]


def _complete(hook, chunk):
    submitted = hook.submit(chunk, metadata={})
    state = wait_terminal(hook, submitted["batch_id"])
    return {**submitted, "state": state.to_dict()}


def test_merge_writes_a_self_contained_report_with_the_summary_figures(openai_conn, openai_hook, tmp_path):
    openai_conn.set_faults(invalid_line_rate=0.3, seed=5)
    batches = [
        _complete(openai_hook, write_chunk(tmp_path / "j", _rows(30), index=0, num_chunks=2)),
        _complete(openai_hook, write_chunk(tmp_path / "j", _rows(20, start=30), index=1, num_chunks=2)),
    ]
    out = tmp_path / "out"
    op = MergeResultsOperator(task_id="merge", batches=batches, output_dir=str(out), max_failure_ratio=None)
    summary = op.execute(make_context())
    page = (out / REPORT_FILE).read_text()
    assert summary["report"] == str(out / REPORT_FILE)
    assert json.loads((out / "_SUMMARY.json").read_text())["report"] == summary["report"]

    # Self-contained: nothing is fetched when it is opened (no script, no external source or stylesheet).
    assert not re.search(r"<script|<link|src=\"http|url\(http|@import", page)
    assert page.count("<svg") == 3  # status breakdown, latency timeline, cost
    # The figures are the summary's.
    errored = summary["statuses"]["errored"]
    assert errored > 0
    assert (
        f'<tr data-status="errored"><td><span style="color:#c62828">■</span> errored</td><td class="n">{errored:,}'
        in page
    )
    kind, count = summary["top_errors"][0]
    examples = summary["error_examples"][kind]
    assert 1 <= len(examples) <= 3 and all(e.startswith("r") for e in examples)
    assert ", ".join(examples) in page
    assert f"<td class='n'>{count:,}</td>" in page
    # One line per chunk, with its batch id and a provider latency taken from the batch timestamps.
    for batch in batches:
        assert batch["batch_id"] in page
    assert page.count("<tr data-chunk=") == 2
    assert batches[0]["state"]["created_at"] and batches[0]["state"]["ended_at"] >= batches[0]["state"]["created_at"]


def test_truncated_answers_and_error_examples_are_counted_from_the_merged_rows(openai_conn, openai_hook, tmp_path):
    """finish_reason "length" rows are counted and named; each error kind keeps up to three row ids."""
    openai_conn.set_faults(invalid_line_rate=0.5, seed=2)
    rows = _rows(40)
    # Every other request allows 2 output tokens: the emulator cuts those answers (finish_reason "length").
    lines = [chat_line(r["custom_id"], r["text"], **({"max_tokens": 2} if i % 2 else {})) for i, r in enumerate(rows)]
    batch = _complete(openai_hook, write_chunk(tmp_path / "j", rows, lines=lines))
    out = tmp_path / "out"
    op = MergeResultsOperator(task_id="merge", batches=[batch], output_dir=str(out), max_failure_ratio=None)
    summary = op.execute(make_context())
    import pyarrow.parquet as pq

    merged = pq.read_table(out).to_pylist()
    truncated = [r["custom_id"] for r in merged if r["finish_reason"] == "length"]
    assert truncated and summary["truncated_rows"] == len(truncated)
    assert summary["truncated_examples"] == truncated[:3]
    failed_ids = {r["custom_id"] for r in merged if r["status"] != "succeeded"}
    for ids in summary["error_examples"].values():
        assert ids and set(ids) <= failed_ids
