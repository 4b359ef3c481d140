"""Streaming intake: requests arrive on a queue; each group goes through the batch pipeline.

    wait_for_group ─► collect_group ─► chunk ─► route ─┬─► server_generate (priority 10) ─┐
    (deferred until                                   └─► submit ─► wait ─────────────────┴─► results ─┐
     64 items or 30 s)                       ack_group ◄─ merge (upsert into stream_results by request id) ◄┘

``schedule="@continuous"`` with ``max_active_runs=1``: as soon as one run ends the next one
starts and defers in ``wait_for_group`` (no worker held) until the queue holds a group. The
``route`` Param picks the generate path: ``server`` (a self-hosted OpenAI-compatible server,
requests sent at lower priority than real-time traffic), ``batch`` (the provider's batch API:
half price, hours of latency), or ``auto``: groups of up to ``server_max_requests`` go to the
server, larger ones to the batch API. Messages are acknowledged by ``ack_group``, after the
merge upserted every row into the ``stream_results`` table keyed by request id: at least once,
never a row twice. Producers: :class:`~airflow_batch_provider.intake.producer.BatchQueueProducer`
or the HTTP endpoint (``python -m airflow_batch_provider.intake.serve``). See docs/streaming.md.

Defaults come from the environment so one file serves every deployment:
``STREAM_INTAKE_QUEUE`` (queue config JSON, default Redis stream ``llm-intake`` on 127.0.0.1),
``STREAM_INTAKE_RESULTS_CONN`` (sqlite/postgres connection of the results table,
default ``stream_results_db``), ``STREAM_INTAKE_MODEL``, ``STREAM_INTAKE_ROUTE``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

import orjson
from airflow.sdk import DAG, Param, task

from airflow_batch_provider.operators.chunk import ChunkOperator
from airflow_batch_provider.operators.intake import AckGroupOperator, CollectGroupOperator, GroupSubmitBatchOperator
from airflow_batch_provider.operators.merge import MergeResultsOperator
from airflow_batch_provider.operators.server import ServerGenerateOperator
from airflow_batch_provider.sensors.batch import BatchCompleteSensor
from airflow_batch_provider.sensors.intake import QueueGroupSensor
from airflow_batch_provider.sinks.sql import SqlUpsertSink

QUEUE = orjson.loads(os.environ.get("STREAM_INTAKE_QUEUE", '{"backend": "redis", "name": "llm-intake"}'))
RESULTS_CONN = os.environ.get("STREAM_INTAKE_RESULTS_CONN", "stream_results_db")
ROUTES = {"server": "server_generate", "batch": "submit"}
BATCH_PRIORITY = 10  # vLLM --scheduling-policy priority: lower first; real-time requests send 0

with DAG(
    dag_id="stream_intake",
    description="Drain the intake queue in groups (64 items or 30 s) through the batch pipeline; at least once.",
    schedule="@continuous",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    params={
        "queue": Param(QUEUE, type="object", description="Queue config: backend (sqs|redis), name, endpoint."),
        "max_items": Param(64, type="integer", minimum=1, description="Flush a group at this many requests."),
        "max_wait": Param(30, type="number", minimum=0, description="…or this many seconds after its first one."),
        "claim_seconds": Param(3600, type="number", minimum=1, description="A group not acked by then is redone."),
        "route": Param(os.environ.get("STREAM_INTAKE_ROUTE", "auto"), type="string", enum=["auto", "server", "batch"]),
        "server_max_requests": Param(1000, type="integer", minimum=0, description="auto: larger groups go batch."),
        "model": Param(os.environ.get("STREAM_INTAKE_MODEL", "gpt-4o-mini"), type="string"),
        "server_conn_id": Param("openai_compatible_default", type="string"),
    },
    tags=["llm-batch", "example", "streaming"],
) as dag:
    waited = QueueGroupSensor(
        task_id="wait_for_group",
        queue_config="{{ params.queue | tojson }}",
        max_items="{{ params.max_items }}",
        max_wait_seconds="{{ params.max_wait }}",
        claim_seconds="{{ params.claim_seconds }}",
        retries=0,
    )
    group = CollectGroupOperator(
        task_id="collect_group",
        queue_config="{{ params.queue | tojson }}",
        max_items="{{ params.max_items }}",
        max_wait_seconds="{{ params.max_wait }}",
        claim_seconds="{{ params.claim_seconds }}",
    )
    waited >> group

    chunks = ChunkOperator(
        task_id="chunk",
        source="{{ ti.xcom_pull(task_ids='collect_group')['table'] }}",
        job_dir="{{ ti.xcom_pull(task_ids='collect_group')['folder'] }}/job",
        id_column="request_id",
        prompt_template="{prompt}",
        model="{{ params.model }}",
        request_params={"max_tokens": 64},
        chunk_size=10_000,
        canary_rows=0,  # a group may go to the self-hosted server; the canary would call the provider
    )
    group >> chunks

    @task.branch
    def route(choice: str, collected: dict[str, Any], server_max: int) -> str:
        """Follow the server path for small groups (or when forced), the provider batch API otherwise."""
        if choice == "auto":
            choice = "server" if int(collected["num_requests"]) <= int(server_max) else "batch"
        return ROUTES[choice]

    routed = route("{{ params.route }}", group.output, "{{ params.server_max_requests }}")
    chunks >> routed

    served = ServerGenerateOperator.partial(
        task_id="server_generate", conn_id="{{ params.server_conn_id }}", priority=BATCH_PRIORITY, max_concurrency=16
    ).expand(chunk=chunks.output)
    # keyed by the group, not the run: a run that takes a failed run's group again reuses its batch
    submitted = GroupSubmitBatchOperator.partial(task_id="submit", group=group.output).expand(chunk=chunks.output)
    finished = BatchCompleteSensor.partial(task_id="wait", poll_interval=5).expand(batch=submitted.output)
    routed >> [served, submitted]

    @task(trigger_rule="none_failed_min_one_success")
    def results(from_server: Any, from_batch: Any) -> list[dict[str, Any]]:
        """Return the completed batches of whichever path ran."""
        return [dict(b) for found in (from_server, from_batch) if found for b in found if b]

    merged = MergeResultsOperator(
        task_id="merge",
        batches=results(served.output, finished.output),
        output_dir="{{ ti.xcom_pull(task_ids='collect_group')['folder'] }}/output",
        sink=SqlUpsertSink(RESULTS_CONN, "stream_results"),
    )
    merged >> AckGroupOperator(task_id="ack_group", queue_config="{{ params.queue | tojson }}", group=group.output)
