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
    assert "rows carried        0 (stored results of an earlier run, not sent)" in printed
    assert "make clean" in printed
