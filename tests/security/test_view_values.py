"""Issue 38 item 5: a bad number or type in an XCom the view reads broke whole pages.

One huge integer in a chunk's ``cost_expected_usd`` made the runs list answer 500 for every reader
of the DAG; ``top_errors: 5`` failed the run page; ``?map_index=²`` or a 5,000-digit index answered
500. Here every such value goes in as Airflow stores it, and the real app answers in-process
(tests/ui/view_client.py): each page answers 200, shows "unreadable value" where the bad value was,
escaped, and the rest of the page as usual.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from html import escape

import pytest

from airflow_batch_provider.ui.values import UNREADABLE, count, show_count, show_usd, text, usd
from tests.ui.view_client import ViewDB, view_client

pytestmark = pytest.mark.security

DAG = "d"
HUGE = 10**4000  # Python prints it (4,001 digits), but float() overflows and f"{:,}" of 10 ** 5000 refuses
TAG = "<img src=x onerror=alert(1)>"


def _run(db: ViewDB, run_id: str, chunks: object, summary: object = None, progress: object = None) -> int:
    pk = db.run(DAG, run_id)
    for task_id, operator in (("chunk", "ChunkOperator"), ("wait", "BatchCompleteSensor"),
                              ("merge", "MergeResultsOperator")):  # fmt: skip
        db.task(DAG, run_id, task_id, operator)
    db.xcom(pk, DAG, run_id, "chunk", "return_value", chunks)
    if summary is not None:
        db.xcom(pk, DAG, run_id, "merge", "return_value", summary)
    if progress is not None:
        db.xcom(pk, DAG, run_id, "wait", "llm_batch_progress", progress)
    return pk


def _chunk(**fields: object) -> dict[str, object]:
    return {"job_dir": "/j", "chunk_index": 0, "label": "chunk 1/1", "num_requests": 10, **fields}


@pytest.fixture
def client() -> Iterator[tuple[ViewDB, object]]:
    db = ViewDB()
    with view_client(db) as test_client:
        yield db, test_client


def test_a_huge_cost_in_one_run_leaves_the_runs_list_readable(client) -> None:
    db, http = client
    _run(db, "fine", [_chunk(cost_expected_usd=0.5)])
    _run(db, "huge", [_chunk(cost_expected_usd=HUGE)])
    _run(db, "infinite", [_chunk(cost_expected_usd=float("inf"), num_requests=HUGE)])
    answer = http.get("/")
    assert answer.status_code == 200, answer.text[:500]
    assert "$0.5000 (estimate)" in answer.text  # the other run of the DAG, as usual
    assert answer.text.count(f"<td class='n cost'>{UNREADABLE}</td>") == 2
    for run_id in ("huge", "infinite"):
        assert f">{run_id}</a>" in answer.text


def test_wrong_types_in_the_merge_summary_leave_the_run_page_readable(client) -> None:
    db, http = client
    summary = {"top_errors": 5, "error_examples": [1], "truncated_rows": "many", "statuses": {TAG: HUGE, "ok": 3},
               "input_tokens": HUGE, "output_tokens": -1, "actual_cost_usd": HUGE, "realtime_cost_usd": "free",
               "succeeded": [HUGE], "failed": {"x": 1}, "report": True}  # fmt: skip
    progress = {**_chunk(label=HUGE), "batch_id": ["b"], "provider_status": {"a": 1}, "completed": HUGE,
                "failed": float("nan"), "total": float("inf"), "attempt": HUGE}  # fmt: skip
    _run(db, "r", [_chunk(num_requests=HUGE, chunk_index=HUGE, cost_expected_usd="1")], summary, progress)
    answer = http.get(f"/runs/{DAG}/r")
    assert answer.status_code == 200, answer.text[:500]
    page = answer.text
    assert f'data-testid="actual-cost"><b>{UNREADABLE}</b>' in page
    assert f'data-testid="estimated-cost"><b>{UNREADABLE}</b>' in page
    assert f"<b>{UNREADABLE} / {UNREADABLE}</b>tokens in / out" in page
    assert f'data-testid="status-{escape(TAG)}"><b>{UNREADABLE}</b>' in page and TAG not in page
    assert 'data-testid="status-ok"><b>3</b>' in page  # the readable values around them, as usual
    assert 'id="chunks"' in page and 'data-testid="run-state"' in page


@pytest.mark.parametrize("stored", [
    json.dumps({"__classname__": "os.system", "__version__": 1, "__data__": "id"}),  # ImportError in Airflow's decoder
    "[" * 100_000 + "]" * 100_000,  # RecursionError
])  # fmt: skip
def test_an_xcom_airflow_cannot_decode_leaves_the_pages_readable(client, stored: str) -> None:
    db, http = client
    pk = _run(db, "r", [_chunk(cost_expected_usd=0.25)])
    db.raw_xcom(pk, DAG, "r", "merge", "return_value", stored)
    db.raw_xcom(pk, DAG, "r", "wait", "llm_batch_progress", stored)
    for path in (f"/runs/{DAG}/r", "/"):
        answer = http.get(path)
        assert answer.status_code == 200, (path, answer.text[:500])
        assert "0.2500" in answer.text  # the chunk list was readable: its estimate shows


def _mapped_run(db: ViewDB) -> None:
    pk = _run(db, "r", [_chunk()])
    db.task(DAG, "r", "wait", "BatchCompleteSensor", map_index=0)
    db.xcom(pk, DAG, "r", "wait", "llm_batch_progress", {**_chunk(), "batch_id": "b1", "total": 10}, map_index=0)


@pytest.mark.parametrize("index", ["²", "٣", "9" * 5000, "{MAP_INDEX}", "-", "1e3", " 0", "0x0", "00000000000"])
def test_an_odd_map_index_shows_the_run_without_a_selection(client, index: str) -> None:
    db, http = client
    _mapped_run(db)
    answer = http.get(f"/runs/{DAG}/r", params={"task_id": "wait", "map_index": index})
    assert answer.status_code == 200, answer.text[:500]
    assert 'data-testid="run-state"' in answer.text and 'class="chunk selected"' not in answer.text


def test_a_map_index_selects_its_chunk(client) -> None:
    """The control: a well-formed index still selects the chunk of its sensor."""
    db, http = client
    _mapped_run(db)
    answer = http.get(f"/runs/{DAG}/r", params={"task_id": "wait", "map_index": "0"})
    assert answer.status_code == 200 and 'class="chunk selected"' in answer.text


@pytest.mark.parametrize(
    ("value", "as_count", "as_usd", "as_text"),
    [
        (7, 7, 7.0, "7"),
        ("7", 7, None, "7"),
        (7.9, 7, 7.9, "7.9"),
        (HUGE, None, None, UNREADABLE),
        (-1, None, None, "-1"),
        (True, None, None, "true"),
        (float("inf"), None, None, UNREADABLE),
        (float("nan"), None, None, UNREADABLE),
        ("²", None, None, "²"),
        ("1" * 14, None, None, "1" * 14),
        ([1], None, None, UNREADABLE),
        ({"a": 1}, None, None, UNREADABLE),
        (None, None, None, ""),
    ],
)
def test_each_reader_returns_its_type_or_says_unreadable(value, as_count, as_usd, as_text) -> None:
    assert (count(value), usd(value), text(value)) == (as_count, as_usd, as_text)
    shown = show_count(value)
    assert shown == ("-" if value is None else UNREADABLE if as_count is None else f"{as_count:,}")
    assert show_usd(value).startswith("$") is (as_usd is not None)
