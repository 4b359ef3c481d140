"""``make bench-scale``'s pieces that run in seconds: arguments, the ``scale:`` line, process usage, the hurry.

The benchmark itself (a real deployment, minutes per size) is not part of ``make test``.
"""

from __future__ import annotations

import os

import httpx
import pytest

from benchmarks.scale import LINE_KEYS, format_line, group_usage, parse_args, table_growth
from tests.conftest import wait_terminal
from tests.support import write_chunk


def test_sizes_come_from_a_comma_separated_list():
    args = parse_args(["--chunks", "10,100,1000", "--poll-interval", "30"])
    assert args.sizes == [10, 100, 1000]
    assert (args.rows_per_chunk, args.window) == (1000, 60.0)


@pytest.mark.parametrize("chunks", ["ten", "0", ""])
def test_bad_sizes_are_refused_with_the_value(chunks, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--chunks", chunks])
    assert "--chunks" in capsys.readouterr().err


def test_the_line_has_the_issues_fields_in_order_then_the_rest():
    result = {key: n for n, key in enumerate(LINE_KEYS)} | {"load_1m": 1.5}
    line = format_line(result)
    assert line.startswith("scale: chunks=0 wall_s=1 overhead_per_chunk_s=2 triggerer_cpu_pct=3 ")
    assert line.endswith("provider_calls_per_batch_per_poll=5 db_kb=6 load_1m=1.5")


def test_group_usage_reads_this_process_group():
    cpu, rss = group_usage(os.getpgid(0))
    assert cpu > 0 and rss > 10
    assert group_usage(2**22 + 12345) == (0.0, 0.0)  # no such group


def test_hurry_ends_the_slow_fault_of_running_batches(openai_conn, openai_hook, tmp_path):
    """The benchmark holds every batch with slow=86400, then lets them all finish at once."""
    openai_conn.set_faults(slow=86400.0)
    batch_id = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "h", "text": "x"}]), metadata={})["batch_id"]
    assert wait_terminal(openai_hook, batch_id, timeout=1.0).status.value in ("validating", "in_progress")
    response = httpx.post(f"{openai_conn.url}/_emulator/hurry", timeout=10)
    assert response.json() == {"hurried": 1}
    assert wait_terminal(openai_hook, batch_id, timeout=20).status.value == "completed"


def test_table_growth_names_the_tables_that_grew_most_per_chunk():
    before = {"xcom": 1000, "task_instance": 500, "job": 800}
    after = {"xcom": 21000, "task_instance": 10500, "job": 700, "trigger": 4000}
    assert table_growth(before, after, chunks=10) == "xcom:2000,task_instance:1000,trigger:400"
    assert table_growth(before, after, chunks=10, top=1) == "xcom:2000"
