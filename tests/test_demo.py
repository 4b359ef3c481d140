"""scripts/demo.py: one output folder per demo configuration, and the merge task's own summary.

The end-to-end runs of ``make demo`` are the README's commands (run by hand; they take a minute
each); these tests pin the two decisions that make every one of them show what it says.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from airflow_batch_provider.results.summary import format_summary_table
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("demo_script", REPO_ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_configuration_has_its_own_output_folder(demo):
    root = Path("/out")
    plain = demo.output_folder(root, "openai", 3000, "", None)
    assert plain == root / "nightly_product_classification-openai-3000-rows"
    assert demo.output_folder(root, "openai", 3000, "", None) == plain  # a rerun finds its stored results
    faults = demo.output_folder(root, "openai", 3000, "--line-error-rate 0.05", None)
    guard = demo.output_folder(root, "openai", 3000, "", 0.0001)
    assert faults.name == "nightly_product_classification-openai-3000-rows-line-error-rate-0.05"
    assert guard.name == "nightly_product_classification-openai-3000-rows-max-cost-usd-0.0001"
    others = [
        demo.output_folder(root, "openai", 2000, "", None),  # a smaller job never deletes a larger one's parts
        demo.output_folder(root, "anthropic", 3000, "", None),
        demo.output_folder(root, "server", 3000, "", None),
    ]
    assert len({plain, faults, guard, *others}) == 6
    long_args = "--line-error-rate 0.02 --expire-rate 0.01 --http-429-rate 0.05 --retry-after 1 --seed 7"
    long_one = demo.output_folder(root, "openai", 3000, long_args, None)
    assert len(long_one.name) < 120
    assert long_one != demo.output_folder(root, "openai", 3000, long_args.replace("7", "8"), None)


def test_the_demo_summary_is_the_merge_tasks(demo, capsys):
    summary = {
        "rows": 2000,
        "chunks": 1,
        "batches": 3,
        "requests_sent": 2000,
        "requests_resent": 68,
        "carried_rows": 0,
        "statuses": {"errored": 1, "succeeded": 1999},
        "retried_rows": 67,
        "recovered_rows": 66,
        "input_tokens": 150_000,
        "output_tokens": 20_000,
        "actual_cost_usd": 0.02,
        "cost_expected_usd": 0.03,
        "cost_upper_bound_usd": 0.07,
        "realtime_cost_usd": 0.04,
        "cost_comparison": "batch vs real-time: …",
        "output": "/out/x",
    }
    demo.print_summary(summary, "openai", 12.0)
    printed = capsys.readouterr().out
    merge_logged = format_summary_table(summary).splitlines()
    for line in merge_logged[:-1]:  # every row the merge logged (the output path is printed last, on its own)
        assert line.split() == next(p for p in printed.splitlines() if p.split()[:2] == line.split()[:2]).split()
    assert "requests resent     68 (line retries, in follow-up batches)" in printed
    assert "rows retried        67 (66 recovered)" in printed
    assert "rows carried        0 (every row was sent in this run)" in printed
    assert "make clean" in printed


def _dags_test_output(chunks: int = 5, polls: int = 40) -> list[str]:
    """Lines shaped like `airflow dags test` prints them (structlog), ~600 of them as in issue 27."""
    stamp = "2026-12-02T00:42:{:02d}.162473Z [info     ] "
    sensor = " [airflow.task.operators.airflow_batch_provider.sensors.batch.BatchCompleteSensor] loc=batch.py:229\n"
    lines = [stamp.format(1) + "Cost estimate: 50,000 requests to gpt-4o-mini: 7,658,511 input tokens" + sensor]
    for poll in range(polls):
        for chunk in range(chunks):
            done = min(10_000, poll * 500)
            text = f"chunk {chunk + 1}/5: batch b{chunk}: in_progress (completed {done}, failed 0, total 10000)"
            lines += [stamp.format(poll % 60) + text + sensor] * 2  # the trigger and the sensor both log a look
            lines += [stamp.format(poll % 60) + "Task instance is in running state [airflow.task] loc=x.py:1\n"]
    for chunk in range(chunks):
        text = f"chunk {chunk + 1}/5: batch b{chunk}: completed (completed 10000, failed 12, total 10000)"
        lines += [stamp.format(58) + text + sensor] * 2
    lines += [stamp.format(58) + "POST /v1/files failed (HTTP 429); retrying in 1.0 s (attempt 1/4)\n"]
    lines += [stamp.format(59) + "chunk 2/5: 12 line(s) failed retryably (errored/server_error x12); sent them again\n"]
    return lines


def test_a_quiet_demo_echoes_polls_that_moved_and_retries_and_stays_short(demo):
    """`make demo` on a fresh clone printed ~600 lines; quiet, the run's part stays well under 150."""
    shown = demo.OutputFilter(verbose=False)
    lines = _dags_test_output()
    echoed = [out for out in map(shown, lines) if out is not None]
    assert len(lines) > 600 and len(echoed) <= demo.OutputFilter.MAX_LINES
    assert echoed[0].startswith("  00:42:01 Cost estimate:") and "[airflow" not in echoed[0]  # time + message
    assert not any("running state" in line for line in echoed)
    polls = [line for line in echoed if "in_progress" in line]
    assert len(polls) == len(set(polls))  # each look once, not once per logger
    assert len(polls) == demo.OutputFilter.MAX_POLLS  # running polls thinned out; every batch end still shown
    assert sum("completed (completed 10000" in line for line in echoed) == 5
    assert "retrying in 1.0 s" in echoed[-2] and "sent them again" in echoed[-1]
    assert "VERBOSE=1" in shown.dropped_note()
    loud = demo.OutputFilter(verbose=True)
    assert [loud(line) for line in lines] == lines


def test_the_cost_guard_failure_is_one_clean_sentence(demo, capsys, tmp_path):
    line = (
        "2026-12-02T00:42:36Z [error    ] Task failed: airflow_batch_provider.exceptions.CostLimitExceededError: "
        "Batch cost $0.0445 (upper bound) exceeds max_cost_usd=$0.0001: 3,000 requests to gpt-4o-mini: …"
    )
    guard = demo.COST_GUARD.search(line)
    notable = {"cost_guard": f"{guard['estimate']} > {guard['limit']}"}
    stats = {"openai": {"files_uploaded": 0, "batches_created": 0}, "anthropic": {}, "bedrock": {}}
    demo.print_failure(1, notable, stats, stats, tmp_path / "never-written", tmp_path / "dags-test.log")
    printed = capsys.readouterr().out
    reason = next(p for p in printed.splitlines() if "reason" in p)
    assert reason.split("reason", 1)[1].strip() == (
        "the cost guard stopped the run before anything was sent: the estimated batch cost $0.0445 is over "
        "MAX_COST_USD=0.0001; raise MAX_COST_USD or lower ROWS."
    )
    assert "files uploaded   0" in printed and "delete the output folder" not in printed and "output:" not in printed


def test_the_summary_says_why_actual_and_expected_cost_differ(demo):
    """The numbers of a default `make demo`: expected $0.7394, actual $0.4293 (issue 27)."""
    estimate = (
        "50,000 requests to gpt-4o-mini: 7,658,511 input tokens (tiktoken o200k_base); expected $0.7394 batch / "
        "$1.48 real-time with 550,000 output tokens (response schema, ~11 tokens/answer); upper bound …"
    )
    summary = {"cost_expected_usd": 0.7394, "actual_cost_usd": 0.4293, "input_tokens": 3_778_300,
               "output_tokens": 486_259, "failed": 0, "carried_rows": 0}  # fmt: skip
    rows = dict(demo.cost_explanation(summary, estimate, emulated=True))
    assert rows["tokens expected"].startswith("7,658,511 in + 550,000 out")
    assert rows["tokens billed"].startswith("3,778,300 in + 486,259 out")
    assert rows["actual vs expected"].startswith("$0.4293 vs $0.7394: input billed 49% of the tokens counted")
    assert "answers were 88% of the expected output tokens" in rows["actual vs expected"]
