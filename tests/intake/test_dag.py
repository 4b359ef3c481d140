"""The ``stream_intake`` DAG under ``dag.test()``: a group goes through chunk → server or batch → merge → ack.

Real Redis / moto SQS, the emulator as both the self-hosted server and the OpenAI Batch API,
SQLite as the results table. One group per DAG run; the queue is empty afterwards and the
table has one row per accepted request id.
"""

from __future__ import annotations

import json
import sqlite3

import orjson
import pytest

from airflow_batch_provider.intake.producer import BatchQueueProducer
from tests.conftest import REPO_ROOT
from tests.intake.write_log import create_logged_table, writes

pytestmark = pytest.mark.stream


@pytest.fixture
def stream_env(openai_conn, tmp_path, monkeypatch, airflow_db):
    db = str(tmp_path / "results.sqlite")
    create_logged_table(db, "stream_results")  # a duplicate write shows in writes(db), never in the keyed rows
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("AIRFLOW_CONN_STREAM_RESULTS_DB", json.dumps({"conn_type": "sqlite", "host": db}))
    server = {"conn_type": "openai_compatible", "host": openai_conn.openai_base_url}
    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT", json.dumps(server))
    return db


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["stream_intake"]


def _rows(db):
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT custom_id, status, response FROM stream_results"))


def test_dag_shape():
    dag = _dag()
    assert type(dag.timetable).__name__ == "ContinuousTimetable"  # schedule="@continuous"
    assert dag.max_active_runs == 1
    assert dag.get_task("ack_group").upstream_task_ids == {"merge", "collect_group"}
    assert dag.get_task("server_generate").partial_kwargs["priority"] == 10


@pytest.mark.parametrize(("route", "server_max", "path"), [("auto", 1000, "server"), ("auto", 10, "batch")])
def test_one_group_through_the_pipeline(queue, stream_env, openai_conn, route, server_max, path):
    producer = BatchQueueProducer(queue)
    accepted = {producer.submit(f"question {i}") for i in range(30)}
    queue.send(b'{"request_id": "broken"')  # malformed: dead-lettered, never blocks the group
    conf = {
        "queue": queue.config(),
        "max_items": 64,
        "max_wait": 0,
        "route": route,
        "server_max_requests": server_max,
    }
    run = _dag().test(run_conf=conf)
    assert run.state == "success"
    rows = _rows(stream_env)
    assert {r[0] for r in rows} == accepted and writes(stream_env) == dict.fromkeys(accepted, 1)
    assert all(r[1] == "succeeded" and r[2] for r in rows)
    assert queue.stats().depth == 0  # acknowledged after the merge wrote them
    assert [orjson.loads(d["body"] + b"}") for d in queue.dead_letters()] == [{"request_id": "broken"}]
    stats = openai_conn.stats()
    if path == "server":
        assert stats["realtime"]["requests"] == 30 and stats["openai"]["batches_created"] == 0
        # The group goes at batch priority (10): real-time traffic on the same vLLM server goes first.
        assert stats["realtime"]["requests_by_priority"] == {"10": 30}
    else:
        assert stats["openai"]["batches_created"] == 1 and stats["realtime"]["requests"] == 0


def test_a_group_whose_output_was_not_written_is_not_acknowledged_and_comes_back(queue, stream_env, monkeypatch):
    """The merge cannot write (results DB in a missing folder): no ack; the next run redoes the group, once."""
    producer = BatchQueueProducer(queue)
    accepted = {producer.submit(f"question {i}") for i in range(10)}
    conf = {"queue": queue.config(), "max_items": 64, "max_wait": 0, "route": "server", "claim_seconds": 2}
    good = json.dumps({"conn_type": "sqlite", "host": stream_env})
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAM_RESULTS_DB", json.dumps({"conn_type": "sqlite", "host": "/nonexistent/x.db"})
    )
    dag = _dag()
    for task in dag.tasks:
        task.retries = 0  # fail at once instead of waiting out the DAG's retry delay
    failed = dag.test(run_conf=conf)
    assert failed.state == "failed"
    states = {ti.task_id: ti.state for ti in failed.get_task_instances()}
    assert states["merge"] == "failed" and states["ack_group"] == "upstream_failed"
    stats = queue.stats()
    assert stats.depth == 10  # still claimed by the failed run, not acknowledged
    monkeypatch.setenv("AIRFLOW_CONN_STREAM_RESULTS_DB", good)
    again = _dag().test(run_conf=conf)  # a fresh parse (new sink); waits out the claim, takes the group again
    assert again.state == "success"
    rows = _rows(stream_env)
    assert {r[0] for r in rows} == accepted and writes(stream_env) == dict.fromkeys(accepted, 1)  # redone once
    assert queue.stats().depth == 0


def test_a_run_that_takes_a_failed_runs_group_again_reuses_its_batch(queue, stream_env, openai_conn, monkeypatch):
    """Issue 26 item 7: the batch route fails after its batch was created (the merge cannot write).

    The next run (a new run id) collects the same messages, so the same group: its submit
    finds the first run's batch at the emulator by the group's idempotency key and follows it.
    One batch created in all, each row once.
    """
    producer = BatchQueueProducer(queue)
    accepted = {producer.submit(f"question {i}") for i in range(12)}
    conf = {"queue": queue.config(), "max_items": 64, "max_wait": 0, "route": "batch", "claim_seconds": 2}
    good = json.dumps({"conn_type": "sqlite", "host": stream_env})
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAM_RESULTS_DB", json.dumps({"conn_type": "sqlite", "host": "/nonexistent/x.db"})
    )
    dag = _dag()
    for task in dag.tasks:
        task.retries = 0
    failed = dag.test(run_conf=conf)
    assert failed.state == "failed"
    states = {ti.task_id: ti.state for ti in failed.get_task_instances()}
    assert states["submit"] == "success" and states["merge"] == "failed"
    assert openai_conn.stats()["openai"]["batches_created"] == 1
    monkeypatch.setenv("AIRFLOW_CONN_STREAM_RESULTS_DB", good)
    again = _dag().test(run_conf=conf)
    assert again.state == "success" and again.run_id != failed.run_id
    assert openai_conn.stats()["openai"]["batches_created"] == 1  # the first run's batch, not a second bill
    rows = _rows(stream_env)
    assert {r[0] for r in rows} == accepted and len(rows) == 12
    assert queue.stats().depth == 0


def test_group_submit_refuses_a_missing_group():
    from airflow_batch_provider.operators.intake import GroupSubmitBatchOperator

    op = GroupSubmitBatchOperator(task_id="submit", chunk={"num_requests": 1}, group={"table": "x"})
    with pytest.raises(ValueError, match="group_id"):
        op.key_scope("manual__1")  # execute asks for it before anything is uploaded
