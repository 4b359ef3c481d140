"""A rerun that carried every row (skip_unchanged, the README's second `make demo`): what its summaries say.

Issue 38 item 2: such a run printed "input billed 22673300% of the tokens counted", tokens billed next
to "actual cost $0.000000", and a report that said nothing about the carried rows.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.chunking.incremental import apply_skip_unchanged, load_previous
from airflow_batch_provider.job_folder import ChunkFiles
from airflow_batch_provider.report.html import write_run_report
from airflow_batch_provider.results.merge import merge_chunk
from airflow_batch_provider.results.summary import MergeStats, format_summary_table
from tests.conftest import REPO_ROOT
from tests.support import write_chunk

EARLIER_BATCH = "batch_6f1e_first_run"


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("demo_script_carried", REPO_ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _carried_everything(tmp_path) -> tuple[dict, MergeStats]:
    """Merge a chunk whose 3 rows were all answered by an earlier run's batch; return its descriptor and stats."""
    answer = {"status": "succeeded", "response": "old answer", "finish_reason": "stop", "error": None}
    earlier = [
        {
            "custom_id": cid,
            "request_fingerprint": f"f-{cid}",
            **answer,
            "input_tokens": 75_000 + i,
            "output_tokens": 9,
            "batch_id": EARLIER_BATCH,
        }
        for i, cid in enumerate("abc")
    ]
    (tmp_path / "out").mkdir()
    pq.write_table(pa.Table.from_pylist(earlier), tmp_path / "out" / "part-00000.parquet")
    rows = [{"custom_id": cid, "text": "t", "request_fingerprint": f"f-{cid}"} for cid in "abc"]
    files = ChunkFiles(tmp_path / "job")
    (chunk,), _ = apply_skip_unchanged(
        [write_chunk(tmp_path / "job", rows)], load_previous(str(tmp_path / "out")), files, files
    )
    assert chunk["num_requests"] == 0  # nothing left to send
    batch = {**chunk, "batch_id": "", "state": None}
    return batch, merge_chunk(None, batch, str(tmp_path / "merged"))  # type: ignore[arg-type]  # no batch: no hook


def test_the_summary_counts_carried_rows_and_bills_this_run_nothing(tmp_path):
    _, stats = _carried_everything(tmp_path)
    summary = stats.to_dict()
    assert (summary["carried_rows"], summary["requests_sent"], summary["carried_batches"]) == (3, 0, [EARLIER_BATCH])
    assert summary["input_tokens"] == 225_003 and summary["new_input_tokens"] == summary["new_output_tokens"] == 0
    table = dict(
        (line.split("  ", 2)[1].strip(), line.split("  ", 2)[2].strip())
        for line in format_summary_table(summary).splitlines()
    )
    assert table["rows carried"].startswith(f"3 (unchanged: the stored results of batch {EARLIER_BATCH} of")
    assert "paid for then" in table["rows carried"]
    assert table["input tokens"] == "225,003 (0 in this run's batches; the rest in the carried rows)"


def test_the_demo_prints_no_ratio_of_a_run_that_sent_nothing(tmp_path, demo):
    _, stats = _carried_everything(tmp_path)
    estimate = (
        "0 requests to gpt-4o-mini: 0 input tokens (approximation chars/4); expected $0.0000 batch / "
        "$0.0000 real-time with 0 output tokens (response schema, ~11 tokens/answer); upper bound …"
    )
    summary = {**stats.to_dict(), "cost_expected_usd": 0.0, "actual_cost_usd": 0.0}
    rows = dict(demo.cost_explanation(summary, estimate, emulated=True))
    assert "tokens billed" not in rows and "tokens expected" not in rows
    why = rows["actual vs expected"]
    assert "%" not in why and "3 rows were carried from an earlier run (paid for then), not sent" in why


def test_the_demo_names_the_counting_rule_the_estimate_used(demo):
    """Not "tiktoken" for a backend whose estimate counts characters (issue 38 item 4)."""
    estimate = (
        "1,000 requests to claude-3-5-haiku: 90,000 input tokens (approximation chars/3.5); expected $0.05 batch / "
        "$0.10 real-time with 11,000 output tokens (response schema, ~11 tokens/answer); upper bound …"
    )
    summary = {"cost_expected_usd": 0.05, "actual_cost_usd": 0.04, "input_tokens": 45_000, "new_input_tokens": 45_000,
               "output_tokens": 9_000, "new_output_tokens": 9_000, "failed": 0, "carried_rows": 0}  # fmt: skip
    why = dict(demo.cost_explanation(summary, estimate, emulated=False))["actual vs expected"]
    assert "input billed 50% of the tokens counted" in why
    assert "approximation chars/3.5" in why and "tiktoken" not in why


def test_the_report_says_which_rows_were_carried_from_which_run(tmp_path):
    batch, stats = _carried_everything(tmp_path)
    summary = {**stats.to_dict(), "actual_cost_usd": 0.0, "output": str(tmp_path / "merged")}
    path = write_run_report(str(tmp_path / "merged"), summary, [(batch, stats)], "d / second-run")
    html = Path(path).read_text(encoding="utf-8")
    assert 'data-testid="carried"><b>3</b>' in html
    note = html[html.index("<p id='carried'>") :].split("</p>", 1)[0]
    assert EARLIER_BATCH in note and "earlier run" in note and "only the rows it sent" in note
    assert "input tokens billed to this run</td><td class='n'>0<" in html


def test_a_long_resend_line_keeps_its_attempt_number(demo):
    """Cut at 200 characters, "(attempt 2 of at most 3)" was lost behind a long provider message (item 4)."""
    message = "errored/server_error: " + "the upstream model answered with an overlong error text " * 8
    line = (
        "2026-12-02T00:42:40.123Z [warning  ] chunk 3/5 (10,000 req): 37 line(s) failed retryably "
        f"({message} x37); sent them again as batch batch_abc123 (attempt 2 of at most 3) [airflow.task]\n"
    )
    echoed = demo.OutputFilter(verbose=False)(line)
    assert echoed is not None and len(echoed) <= demo.ECHO_LIMIT + 20
    assert echoed.startswith("  00:42:40 chunk 3/5 (10,000 req): 37 line(s) failed retryably")
    assert echoed.rstrip().endswith("sent them again as batch batch_abc123 (attempt 2 of at most 3)")


def test_the_merges_chunk_counts_are_what_the_view_shows(tmp_path):
    """One source of truth: the view's chunk line is the merge's count of that chunk (issue 38 item 1)."""
    from airflow_batch_provider.results.summary import chunk_counts
    from airflow_batch_provider.ui.model import TaskRecord, build_run_view

    batch, stats = _carried_everything(tmp_path)
    summary = {**stats.to_dict(), "chunk_counts": chunk_counts([(batch, stats)])}
    tasks = [
        TaskRecord("chunk", -1, "ChunkOperator", "success", None, None, 1, result=[batch]),
        TaskRecord("merge", -1, "MergeResultsOperator", "success", None, None, 1, result=summary),
    ]
    (row,) = build_run_view("d", "r", "success", tasks).chunks
    assert row.merged and (row.succeeded, row.failed, row.carried, row.total, row.done) == (3, 0, 3, 3, 3)
