"""Incremental reprocessing under a real Airflow: only new or changed rows reach the provider.

Uses ``dags/reprocess_after_prompt_change.py`` (``skip_unchanged=True``) on the same deployment
as the crash suite: a first run sends every row, a run with 1,000 more rows sends only those, and
a run with a new ``prompt_version`` sends every row again.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.scheduler.deployment import Deployment

pytestmark = [pytest.mark.scheduler, pytest.mark.timeout(600)]

DAG_ID = "reprocess_after_prompt_change"
RUN_TIMEOUT = 240.0


def _requests(deployment: Deployment) -> int:
    return int(deployment.emulator_get("/_emulator/stats")["openai"]["requests_processed"])


def _run(deployment: Deployment, folder: Path, rows: int, version: int) -> tuple[int, list[dict]]:
    before = _requests(deployment)
    run_id = f"reprocess-{rows}-v{version}-{uuid.uuid4().hex[:6]}"
    conf = {
        "rows": rows,
        "prompt_version": version,
        "data_dir": str(folder / "data"),
        "output_dir": str(folder / "out"),
        "poll_interval": 1,
    }
    deployment.trigger(DAG_ID, run_id, conf)
    state = deployment.wait_for_run(DAG_ID, run_id, RUN_TIMEOUT)
    assert state == "success", deployment.diagnostics()
    merged = pq.read_table(folder / "out").to_pylist()
    assert len(merged) == rows and len({m["custom_id"] for m in merged}) == rows
    assert all(m["status"] == "succeeded" for m in merged)
    return _requests(deployment) - before, merged


def test_new_rows_and_prompt_changes(deployment: Deployment, tmp_path: Path) -> None:
    """2,000 rows → 2,000 sent; 3,000 rows → 1,000 sent (the new ones); prompt v2 → 3,000 sent."""
    deployment.wait_for_dag(DAG_ID)
    sent, _ = _run(deployment, tmp_path, 2000, 1)
    assert sent == 2000
    sent, grown = _run(deployment, tmp_path, 3000, 1)
    assert sent == 1000
    assert {m["custom_id"] for m in grown if m["attempts"] == 1} == {m["custom_id"] for m in grown[2000:]}
    sent, _ = _run(deployment, tmp_path, 3000, 2)
    assert sent == 3000
