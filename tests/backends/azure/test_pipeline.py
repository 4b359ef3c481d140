"""The example DAG on provider ``azure``: chunk → submit → wait (deferred) → merge, against the emulator's Azure routes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Migrate the test metadata DB (``dag.test()`` needs it)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)


@pytest.mark.scenario
def test_example_dag_on_azure(airflow_db, azure_conn, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from airflow_batch_emulator.examples import synthetic_products

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    out = tmp_path / "out"
    conf = {"rows": 400, "provider": "azure", "data_dir": str(tmp_path / "data"), "output_dir": str(out)}
    run = dag.test(run_conf={**conf, "poll_interval": 0.2})
    assert run.state == "success"
    merged = pq.read_table(out).to_pylist()
    assert [r["custom_id"] for r in merged] == [r["product_id"] for r in synthetic_products(400).to_pylist()]
    assert all(r["status"] == "succeeded" and r["label"] for r in merged)
    routes = azure_conn.stats()["routes"]
    assert routes["POST /openai/batches"] == 1 and "POST /v1/batches" not in routes
    again = dag.test(run_conf={**conf, "poll_interval": 0.2})  # same rows, same requests: nothing is sent
    assert again.state == "success"
    assert azure_conn.stats()["routes"]["POST /openai/batches"] == 1
