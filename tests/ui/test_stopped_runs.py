"""A run the cost guard stopped (issue 38 item 4): the runs list showed no reason, only "-".

The ChunkOperator's own guard publishes its message; stored as Airflow stores XComs, the real app
shows it in the runs list and on the run page (tests/ui/view_client.py: a real schema, in-process).
"""

from __future__ import annotations

from html import escape

import pytest

from airflow_batch_provider.exceptions import CostLimitExceededError
from airflow_batch_provider.progress import STOPPED_KEY
from tests.operators.test_chunk_cost import _op
from tests.support import make_context
from tests.ui.view_client import ViewDB, view_client

DAG, RUN = "nightly", "manual__guarded"


def test_the_cost_guards_message_is_shown_with_the_run(tmp_path):
    context = make_context()
    with pytest.raises(CostLimitExceededError) as info:
        _op(tmp_path, max_cost_usd=0.000001).execute(context)
    ((key, record),) = [(k, v) for k, v in context["ti"].pushed if k == STOPPED_KEY]
    assert record == {"reason": str(info.value), "provider": "openai", "model": "gpt-4o-mini"}

    db = ViewDB()
    pk = db.run(DAG, RUN, state="failed")
    db.task(DAG, RUN, "chunk", "ChunkOperator")
    db.task(DAG, RUN, "wait", "BatchCompleteSensor")
    db.xcom(pk, DAG, RUN, "chunk", key, record)
    with view_client(db) as http:
        runs, page = http.get("/").text, http.get(f"/runs/{DAG}/{RUN}").text
    shown = escape(str(info.value), quote=True)
    assert "Batch cost $" in shown and "Nothing was uploaded" in shown
    for html in (runs, page):
        assert f"<b>Stopped before anything was sent:</b> {shown}</div>" in html
        assert "openai · gpt-4o-mini" in html
