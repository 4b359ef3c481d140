"""Backfills under a real Airflow: a range of dates bills each row once, and backfilling it again bills nothing.

The example DAG (``@daily``, ``skip_unchanged=True`` against its own output folder) is backfilled
over three dates through the REST API, as ``airflow backfill create`` does, one run at a time
(``max_active_runs=1``: a backfill's limit is its own, not the DAG's). The first date sends every
row; the later dates find every row stored with the same request fingerprint and send none. A
second backfill over the same dates with ``reprocess_behavior="completed"`` reruns all three and
sends nothing either. The output keeps one row per source row throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.scheduler.deployment import Deployment
from tests.scheduler.processes import wait_for

pytestmark = [pytest.mark.scheduler, pytest.mark.timeout(600)]

DAG_ID = "nightly_product_classification"
ROWS = 1500
DATES = ("2026-03-02T00:00:00Z", "2026-03-04T00:00:00Z")  # three daily runs: 2, 3 and 4 March
BACKFILL_TIMEOUT = 420.0


def _requests(deployment: Deployment) -> int:
    return int(deployment.emulator_get("/_emulator/stats")["openai"]["requests_processed"])


def _backfill_runs(deployment: Deployment) -> list[dict[str, Any]]:
    """Return the runs of :data:`DATES` (the scheduler's backfill runs), oldest first."""
    data = deployment.api(
        "GET",
        f"/dags/{DAG_ID}/dagRuns",
        params={"limit": 100, "logical_date_gte": DATES[0], "logical_date_lte": DATES[1]},
    )
    return sorted(data["dag_runs"], key=lambda r: r["logical_date"])


def _backfill(deployment: Deployment, folder: Path, reprocess: str) -> list[dict[str, Any]]:
    """Create a backfill over :data:`DATES`, wait until Airflow marks it completed; return its runs."""
    conf = {"rows": ROWS, "data_dir": str(folder / "data"), "output_dir": str(folder / "out"), "poll_interval": 1}
    backfill = deployment.api(
        "POST",
        "/backfills",
        json={
            "dag_id": DAG_ID,
            "from_date": DATES[0],
            "to_date": DATES[1],
            "dag_run_conf": conf,
            "max_active_runs": 1,
            "reprocess_behavior": reprocess,
        },
    )
    wait_for(
        lambda: deployment.api("GET", f"/backfills/{backfill['id']}")["completed_at"],
        BACKFILL_TIMEOUT,
        f"backfill {backfill['id']} to complete",
        2.0,
    )
    runs = _backfill_runs(deployment)
    assert [(r["run_type"], r["state"]) for r in runs] == [("backfill", "success")] * 3, deployment.diagnostics()
    return runs


def _output(folder: Path) -> list[dict[str, Any]]:
    merged = pq.read_table(folder / "out").to_pylist()
    assert len(merged) == ROWS and len({m["custom_id"] for m in merged}) == ROWS  # no row twice
    assert all(m["status"] == "succeeded" and m["response"] for m in merged)
    return merged


def test_a_backfill_bills_each_row_once_and_again_bills_nothing(deployment: Deployment, tmp_path: Path) -> None:
    before = _requests(deployment)
    runs = _backfill(deployment, tmp_path, "none")
    assert sorted(r["logical_date"][:10] for r in runs) == ["2026-03-02", "2026-03-03", "2026-03-04"]
    assert _requests(deployment) - before == ROWS  # the first date sent them; the others carried them
    first = _output(tmp_path)
    assert sorted({m["attempts"] for m in first}) == [0]  # the last run kept every stored result

    before = _requests(deployment)
    _backfill(deployment, tmp_path, "completed")  # the same dates again: every run reruns
    assert _requests(deployment) - before == 0
    again = _output(tmp_path)
    keep = ("custom_id", "response", "batch_id", "input_tokens", "output_tokens")
    assert [{k: m[k] for k in keep} for m in again] == [{k: m[k] for k in keep} for m in first]
