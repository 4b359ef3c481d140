"""How often SubmitBatchOperator reads the provider's batch list (issue 30: a 1,000-chunk job's look-ups).

Real OpenAI SDK against the emulator; list pages are counted in this process (the emulator's route
counter is shared with other tests' background pollers).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import openai.pagination
import pytest

from airflow_batch_provider.operators.submit import SubmitBatchOperator
from tests.support import InMemoryTaskStateStore, make_context, write_chunk


@pytest.fixture
def list_pages(monkeypatch) -> list[int]:
    pages: list[int] = []
    first_page, next_page = openai.resources.batches.Batches.list, openai.pagination.SyncCursorPage.get_next_page
    monkeypatch.setattr(
        openai.resources.batches.Batches, "list", lambda *a, **k: pages.append(1) or first_page(*a, **k)
    )
    monkeypatch.setattr(
        openai.pagination.SyncCursorPage, "get_next_page", lambda self: pages.append(1) or next_page(self)
    )
    return pages


def _context(try_number: int, clear_number: int = 0) -> dict:
    context = make_context(InMemoryTaskStateStore())
    context["ti"].try_number = try_number
    context["dag_run"] = SimpleNamespace(start_date=datetime.now(UTC) - timedelta(minutes=1), clear_number=clear_number)
    return context


@pytest.mark.parametrize(
    ("try_number", "clear_number", "lists"),
    [
        pytest.param(1, 0, 0, id="first-try: no look-up, before or after the create"),
        pytest.param(2, 0, 2, id="retry: the key is looked up before creating too"),
        pytest.param(1, 1, 2, id="cleared run: the same"),
    ],
)
def test_the_first_try_of_a_run_looks_nothing_up(openai_conn, tmp_path, list_pages, try_number, clear_number, lists):
    chunk = write_chunk(tmp_path, [{"custom_id": f"l{i}", "text": "t"} for i in range(2)])
    submitted = SubmitBatchOperator(task_id="submit", chunk=chunk).execute(_context(try_number, clear_number))
    assert submitted["batch_id"] and len(list_pages) == lists
    assert submitted["key_since"] is not None  # the sensor looks back only to the intent
