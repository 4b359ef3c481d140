"""Hourly maintenance: cancel duplicate batches that landed after their runs ended.

A create whose answer was lost, or that reached the provider after its client gave up, can make
a second batch for a chunk once every in-run check is over. This DAG runs
``python -m airflow_batch_provider.jobs reconcile --since 24h`` every hour: it lists the last day's
batches carrying this package's idempotency keys, cancels each one whose key is already served
by the batch its checkpoint names, and logs an ``ALERT`` line (and counts
``llm_batch.late_duplicate_batches``) for each. It sends nothing and costs nothing but list calls.

The command reads checkpoints from the metadata DB, which Airflow 3 tasks may not open in process,
so it runs as a subprocess (the worker's Airflow configuration names the DB). By default it checks
every backend the checkpoints name, through its default connection only; set ``BATCH_RECONCILE_ARGS``
(e.g. ``--conn-id openai=openai_prod``, repeatable) to name the connections it may use instead.
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

EXTRA_ARGS = os.environ.get("BATCH_RECONCILE_ARGS", "")

with DAG(
    dag_id="batch_maintenance",
    description="Cancel duplicate LLM batches that landed after their runs (hourly)",
    schedule=timedelta(hours=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["llm-batch", "maintenance"],
) as dag:
    BashOperator(
        task_id="reconcile",
        # The interpreter that parsed this file: the one with the provider installed (PATH may lack it).
        bash_command=f"{shlex.quote(sys.executable)} -m airflow_batch_provider.jobs reconcile --since 24h {EXTRA_ARGS}",
        execution_timeout=timedelta(minutes=30),
        retries=1,
    )
