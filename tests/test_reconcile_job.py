"""``python -m airflow_batch_provider.jobs reconcile``: a create that landed after its run is found and cancelled.

Real OpenAI SDK against the emulator; the checkpoints are rows of Airflow's own ``task_state_store``
table (its SQLAlchemy model) in a throwaway SQLite database, as the metadata DB holds them.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime

import pytest

from airflow_batch_provider import metrics as metrics_module
from airflow_batch_provider.backends.openai.hook import OpenAIBatchHook
from airflow_batch_provider.jobs.__main__ import main
from airflow_batch_provider.jobs.reconcile import Submission, served_keys, submissions
from tests.backends.gemini.conftest import gemini_conn  # noqa: F401  (the fixture)
from tests.conftest import wait_terminal
from tests.support import write_chunk
from tests.test_metrics import InMemoryStats


@pytest.fixture
def database(tmp_path):
    """A SQLite DB holding Airflow's task_state_store table; returns (url, add_row)."""
    from airflow.models.dagrun import DagRun  # noqa: F401  (its table is the FK target: load it into the metadata)
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    url = f"sqlite:///{tmp_path / 'meta.db'}"
    engine = create_engine(url)
    TaskStateStoreModel.__table__.create(engine)
    rows = iter(range(1, 1000))

    def add(key: str, value: object, map_index: int = 0) -> None:
        with Session(engine) as session, session.begin():
            session.add(TaskStateStoreModel(id=next(rows), dag_run_id=1, task_id="submit", map_index=map_index,
                                            key=key, dag_id="nightly", run_id="r1", value=json.dumps(value),
                                            updated_at=datetime.now(UTC)))  # fmt: skip

    return url, add


def _batch(hook: OpenAIBatchHook, file_id: str, chunk, key: str) -> str:
    return hook.create_batch(chunk, input_file_id=file_id, metadata={"airflow_idempotency_key": key})


def test_reconcile_cancels_a_late_duplicate_and_alerts(openai_conn, tmp_path, database, monkeypatch, capsys, caplog):
    stats = InMemoryStats()
    monkeypatch.setattr(metrics_module, "airflow_stats", lambda: stats)
    openai_conn.set_faults(slow=60.0)  # every batch stays live
    url, add = database
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    hook = OpenAIBatchHook()
    file_id = hook.upload_file(chunk["requests_path"])
    kept = _batch(hook, file_id, chunk, "key-a")
    late = _batch(hook, file_id, chunk, "key-a")  # the create that landed after the run
    follow_kept = _batch(hook, file_id, chunk, "key-f")
    unmanaged = _batch(hook, file_id, chunk, "key-none")  # no checkpoint: which one a run used is unknown
    add("batch_submission", {"idempotency_key": "key-a", "batch_id": kept})
    add("batch_wait.attempt-2", {"idempotency_key": "key-f", "batch_id": follow_kept}, map_index=1)
    add("batch_submission", "not a record", map_index=2)  # hostile rows are skipped
    with caplog.at_level(logging.WARNING):
        assert main(["reconcile", "--since", "1h", "--database", url]) == 0
    out = capsys.readouterr().out
    assert f"ALERT late duplicate openai batch {late}" in out and f"served by batch {kept}; cancelled" in out
    assert "1 late duplicate batch(es) found in the last 1h; 1 cancelled" in out
    assert any("ALERT" in r.getMessage() and late in r.getMessage() for r in caplog.records)
    assert wait_terminal(hook, late).status.value == "cancelled"
    for batch_id in (kept, follow_kept, unmanaged):
        assert not hook.get_state(batch_id).status.is_terminal
    counted = {stat: count for kind, stat, count, _ in stats.calls if kind == "incr"}
    assert counted == {"llm_batch.late_duplicate_batches": 1, "llm_batch.duplicate_batches_cancelled": 1}


def test_dry_run_and_an_ended_duplicate_are_reported_not_cancelled(openai_conn, tmp_path, database, capsys):
    url, add = database
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    hook = OpenAIBatchHook()
    file_id = hook.upload_file(chunk["requests_path"])
    kept, ended = _batch(hook, file_id, chunk, "key-e"), _batch(hook, file_id, chunk, "key-e")
    wait_terminal(hook, ended)
    add("batch_submission", {"idempotency_key": "key-e", "batch_id": kept})
    assert main(["reconcile", "--since", "1h", "--database", url, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"batch {ended}" in out and "already completed, could not be cancelled" in out
    assert "1 of 1 request(s) had run (billed)" in out


def test_bad_arguments_are_refused():
    assert main(["reconcile", "--since", "soon"]) == 2
    assert main(["reconcile", "--since", "1h", "--conn-id", "openai"]) == 2


def test_served_keys_takes_only_well_formed_checkpoint_records():
    rows = [
        ("batch_submission", json.dumps({"idempotency_key": "k1", "batch_id": "b1"})),
        ("batch_wait.attempt-2", json.dumps({"idempotency_key": "k2", "batch_id": "b2"})),
        ("batch_wait", json.dumps({"idempotency_key": "k3", "batch_id": "b3"})),  # the sensor's own record
        ("batch_submission", json.dumps({"idempotency_key": "k4"})),  # an intent, no batch yet
        ("batch_submission", "{not json"),
        ("batch_submission", None),
    ]
    assert served_keys(rows) == {"k1": "b1", "k2": "b2"}
    hostile = [("batch_submission", json.dumps({"idempotency_key": "k5", "batch_id": "b5", "num_requests": "9",
                                                "unsure_since": True, "usd_per_request": -1}))]  # fmt: skip
    assert submissions(hostile) == [Submission("k5", "b5")]  # ill-typed fields are dropped, not trusted
    full = {"idempotency_key": "k6", "batch_id": "b6", "provider": "anthropic", "conn_id": "claude_prod",
            "num_requests": 4, "unsure_since": 100.0, "intent_at": 90.0, "usd_per_request": 0.01}  # fmt: skip
    assert submissions([("batch_submission", json.dumps(full))]) == [
        Submission(
            "k6", "b6", "anthropic", 4, unsure_since=100.0, intent_at=90.0, conn_id="claude_prod", usd_per_request=0.01
        )
    ]


def test_without_providers_every_checkpointed_connection_is_reconciled(
    anthropic_conn, openai_conn, database, monkeypatch
):
    """The hourly run needs no --provider: each intent names its provider and connection (older ones: OpenAI)."""
    from airflow_batch_provider.jobs import reconcile as reconcile_module

    url, add = database
    add("batch_submission", {"idempotency_key": "k1", "batch_id": "b1", "provider": "anthropic",
                             "conn_id": "anthropic_batch_default"})  # fmt: skip
    add("batch_submission", {"idempotency_key": "k2", "batch_id": "b2"}, map_index=1)  # from before: no provider
    seen: list[tuple[str, str]] = []

    def record(hook, records, **_):
        seen.append((hook.provider, hook.conn_id))
        return []

    monkeypatch.setattr(reconcile_module, "reconcile_unkeyed", record)
    monkeypatch.setattr(reconcile_module, "reconcile", record)
    assert main(["reconcile", "--since", "1h", "--database", url]) == 0
    assert sorted(seen) == [("anthropic", "anthropic_batch_default"), ("openai", "openai_batch_default")]


def test_the_maintenance_dag_runs_the_command_hourly():
    import importlib.util
    from datetime import timedelta

    from tests.conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location("batch_maintenance", REPO_ROOT / "dags" / "batch_maintenance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert getattr(dag.timetable, "delta", getattr(dag.timetable, "_delta", None)) == timedelta(hours=1)
    command = dag.get_task("reconcile").bash_command
    assert "-m airflow_batch_provider.jobs reconcile --since 24h" in command


def test_reconcile_covers_gemini_by_display_name(gemini_conn, tmp_path):  # noqa: F811
    """Gemini keeps the key in the display name: a second live batch with a served key is cancelled."""
    from airflow_batch_provider.backends.gemini.hook import GeminiBatchHook
    from airflow_batch_provider.jobs.reconcile import reconcile
    from tests.backends.gemini.conftest import gemini_chunk

    gemini_conn.set_faults(slow=60.0)
    hook = GeminiBatchHook()
    chunk = gemini_chunk(tmp_path, 2)
    file_id = hook.upload_file(chunk["requests_path"])
    meta = {"airflow_idempotency_key": "key-g", "airflow_dag_id": "nightly"}
    kept, late = (hook.create_batch(chunk, input_file_id=file_id, metadata=meta) for _ in range(2))
    found = reconcile(hook, [Submission("key-g", kept)], since=0.0, metrics=metrics_module.BatchMetrics(
        provider="gemini", model="any", stats=InMemoryStats()))  # fmt: skip
    assert [(d.batch_id, d.served_by, d.cancelled) for d in found] == [(late, kept, True)]
    assert wait_terminal(hook, late).status.value == "cancelled"
    assert not hook.get_state(kept).status.is_terminal


def test_reconcile_reports_an_ended_anthropic_duplicate_by_its_rows(anthropic_conn, anthropic_hook, tmp_path):
    """Anthropic batches carry no key: a finished batch holding a served batch's rows is reported, not cancelled."""
    from airflow_batch_provider.jobs.reconcile import reconcile_unkeyed
    from tests.batches.test_anthropic_adoption import _chunk

    stats = InMemoryStats()
    mine, other = _chunk(tmp_path, 0), _chunk(tmp_path, 1)  # the same size, other rows
    served = anthropic_hook.submit(mine, metadata={})["batch_id"]
    late = anthropic_hook.submit(mine, metadata={})["batch_id"]  # the same rows again: a late create
    stranger = anthropic_hook.submit(other, metadata={})["batch_id"]
    for batch_id in (served, late, stranger):
        wait_terminal(anthropic_hook, batch_id)
    found = reconcile_unkeyed(anthropic_hook, [Submission("k", served, "anthropic")], since=0.0, metrics=metrics_module.BatchMetrics(
        provider="anthropic", model="any", stats=stats))  # fmt: skip
    assert [(d.batch_id, d.served_by, d.cancelled) for d in found] == [(late, served, False)]
    assert "its rows are served by" in found[0].line() and "could not be cancelled" in found[0].line()
    assert [(stat, count) for _, stat, count, _ in stats.calls] == [("llm_batch.late_duplicate_batches", 1)]


def test_a_late_anthropic_create_after_an_unsure_one_is_cancelled_with_its_cost(
    anthropic_conn, anthropic_hook, tmp_path
):
    """The issue's case without a key: chunk A's first create had an unknown outcome, its retry made A's batch;
    A's first create lands later. No checkpoint names it, its size is A's and it came after the unsure create:
    cancelled, with an ALERT that says what it cost. Other batches of that size that no unsure create explains,
    and every batch while a create of that size may still be in flight, are left alone."""
    from airflow_batch_provider.batches.checkpoint import Checkpoint
    from airflow_batch_provider.batches.submission import submit_once
    from airflow_batch_provider.jobs.reconcile import reconcile_unkeyed
    from tests.batches.test_anthropic_adoption import _chunk, _submit
    from tests.support import InMemoryTaskStateStore

    stats = InMemoryStats()
    anthropic_conn.set_faults(slow=60.0)
    a, b = _chunk(tmp_path, 0), _chunk(tmp_path, 1)
    a["cost_expected_usd"] = 0.04  # 4 requests: $0.01 each
    store = InMemoryTaskStateStore()
    store.set("submit", {"fingerprint": a["fingerprint"], "idempotency_key": "k", "intent_at": time.time() - 5})
    served = _submit(anthropic_hook, a, store)["batch_id"]  # the retry: nothing to adopt yet, creates A's batch
    record = store.get("submit")
    assert record["batch_id"] == served and record["unsure_since"] <= time.time() - 5
    assert (record["provider"], record["num_requests"], record["usd_per_request"]) == ("anthropic", 4, 0.01)
    b_batch = _submit(anthropic_hook, b, InMemoryTaskStateStore())["batch_id"]  # B, sure: named by its record
    late = anthropic_hook.create_batch(a, input_file_id=None, metadata={})  # A's first create, landing now
    rows = [("batch_submission", json.dumps(record)),
            ("batch_submission", json.dumps({"idempotency_key": "kb", "batch_id": b_batch, "provider": "anthropic",
                                             "num_requests": 4}))]  # fmt: skip

    pending = [*submissions(rows), Submission("kc", None, "anthropic", 4, intent_at=time.time())]
    assert (
        reconcile_unkeyed(
            anthropic_hook,
            pending,
            since=0.0,
            metrics=metrics_module.BatchMetrics(provider="anthropic", model="any", stats=stats),
        )
        == []
    )  # fmt: skip  (a create of that size in flight)
    found = reconcile_unkeyed(anthropic_hook, submissions(rows), since=0.0, metrics=metrics_module.BatchMetrics(
        provider="anthropic", model="any", stats=stats))  # fmt: skip
    assert [(d.batch_id, d.served_by, d.cancelled) for d in found] == [(late, served, True)]
    assert "cancelled; cost: 0 of 4 request(s) had run (billed, ≈ $0.0000 at the chunk's expected price)" in (
        found[0].line()
    )
    assert wait_terminal(anthropic_hook, late, timeout=10).status.value == "cancelled"
    for batch_id in (served, b_batch):
        assert not anthropic_hook.get_state(batch_id).status.is_terminal
    counted = [(stat, count) for kind, stat, count, _ in stats.calls if kind == "incr"]
    assert counted == [("llm_batch.late_duplicate_batches", 1), ("llm_batch.duplicate_batches_cancelled", 1)]
    assert Checkpoint and submit_once  # the real submit path wrote the record read above


def test_a_connection_only_old_checkpoints_name_is_skipped_with_a_warning(anthropic_conn, database, caplog):
    """An Anthropic-only deployment with records from before intents named their provider: no OpenAI connection."""
    url, add = database
    add("batch_submission", {"idempotency_key": "k1", "batch_id": "b1"})  # counts as OpenAI's
    with caplog.at_level(logging.WARNING):
        assert main(["reconcile", "--since", "1h", "--database", url]) == 0
    assert any("'openai_batch_default' of provider openai does not exist" in r.getMessage() for r in caplog.records)
    with pytest.raises(Exception, match="openai_batch_default"):  # asked for by name: the error stands
        main(["reconcile", "--since", "1h", "--database", url, "--provider", "openai"])
