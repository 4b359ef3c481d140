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
from airflow_batch_provider.jobs.checkpoints import Submission, claimed_batches, served_keys, submissions
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

    def add(key: str, value: object, map_index: int = 0, *, text: str | None = None) -> None:
        """Store ``value`` as JSON (or ``text`` as it is: a row no JSON encoder would write)."""
        with Session(engine) as session, session.begin():
            session.add(TaskStateStoreModel(id=next(rows), dag_run_id=1, task_id="submit", map_index=map_index,
                                            key=key, dag_id="nightly", run_id="r1", updated_at=datetime.now(UTC),
                                            value=json.dumps(value) if text is None else text))  # fmt: skip

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
    assert submissions(hostile) == []  # a row with an ill-typed field is skipped whole (and reported), not trusted
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
    bad = [
        ("batch_submission", json.dumps({"batch_id": late, "num_requests": 4}))
    ]  # no key: skipped, yet it names late
    assert claimed_batches(bad) == {late}
    assert reconcile_unkeyed(anthropic_hook, submissions(rows), since=0.0, claimed=claimed_batches(bad),
                             metrics=metrics_module.BatchMetrics(provider="anthropic", model="any",
                                                                 stats=InMemoryStats())) == []  # fmt: skip
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


def test_hostile_rows_are_skipped_with_a_warning_and_the_rest_is_reconciled(
    openai_conn, tmp_path, database, monkeypatch, capsys, caplog
):
    """Issue 38 item 8: one hostile row stopped the job for every DAG; a row could pick the connection listed.

    Each bad row is one warning naming its DAG, run and chunk and what is wrong; a row naming a
    connection the job is not configured for is skipped and reported, and that connection is never used.
    """
    from airflow_batch_provider.hooks import registry

    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_ELSEWHERE", json.dumps({"conn_type": "openai_batch",
                       "host": openai_conn.openai_base_url, "password": "another-key"}))  # fmt: skip
    built: list[tuple[str, str | None]] = []
    real = registry.get_batch_hook
    monkeypatch.setattr(registry, "get_batch_hook", lambda p, c=None, **kw: built.append((p, c)) or real(p, c, **kw))
    openai_conn.set_faults(slow=60.0)
    url, add = database
    chunk = write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}])
    hook = OpenAIBatchHook()
    file_id = hook.upload_file(chunk["requests_path"])
    kept, late = _batch(hook, file_id, chunk, "key-a"), _batch(hook, file_id, chunk, "key-a")
    add("batch_submission", {"idempotency_key": "key-a", "batch_id": kept, "provider": "openai",
                             "conn_id": "openai_batch_default"})  # fmt: skip
    hostile = {
        1: '{"idempotency_key": "k1", "batch_id": "b1", "num_requests": 1e999}',
        2: json.dumps({"idempotency_key": "k2", "batch_id": "b2", "provider": "../../evil"}),
        3: json.dumps({"idempotency_key": "k3", "batch_id": "b3", "provider": "openai", "conn_id": "anthropic_batch_default"}),
        4: json.dumps({"idempotency_key": "k4", "batch_id": "b4", "provider": "openai", "conn_id": "openai_elsewhere"}),
        5: "[" * 5000 + "]" * 5000,
    }  # fmt: skip
    for index, text in hostile.items():
        add("batch_submission", None, map_index=index, text=text)
    with caplog.at_level(logging.WARNING, logger="airflow_batch_provider.jobs.checkpoints"):
        assert main(["reconcile", "--since", "1h", "--database", url]) == 0
    assert f"ALERT late duplicate openai batch {late}" in capsys.readouterr().out
    assert wait_terminal(hook, late).status.value == "cancelled"
    assert built == [("openai", "openai_batch_default")]  # the row naming openai_elsewhere chose nothing
    warnings = [r.getMessage() for r in caplog.records if r.name.endswith("checkpoints")]
    assert len(warnings) == len(hostile), warnings
    for index, reason in [(1, "num_requests inf is not a whole number"), (2, "provider '../../evil' is not a batch"),
                          (3, "connection 'anthropic_batch_default' is not one this job checks for openai"),
                          (4, "--conn-id openai=openai_elsewhere"), (5, "its value is not JSON")]:  # fmt: skip
        where = f"the checkpoint of DAG 'nightly', run 'r1', task 'submit', chunk {index}"
        assert any(where in w and reason in w for w in warnings), (index, warnings)


def test_a_connection_given_with_conn_id_is_checked(openai_conn, database, monkeypatch):
    """--conn-id PROVIDER=CONN_ID (repeatable) names the connections the job may use; each is checked."""
    from airflow_batch_provider.jobs import reconcile as reconcile_module

    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_ELSEWHERE", json.dumps({"conn_type": "openai_batch",
                       "host": openai_conn.openai_base_url, "password": "another-key"}))  # fmt: skip
    url, add = database
    add("batch_submission", {"idempotency_key": "k4", "batch_id": "b4", "provider": "openai",
                             "conn_id": "openai_elsewhere"})  # fmt: skip
    seen: list[tuple[str, str, list[str]]] = []
    monkeypatch.setattr(reconcile_module, "reconcile",
                        lambda hook, records, **_: seen.append((hook.provider, hook.conn_id,
                                                                [r.key for r in records])) or [])  # fmt: skip
    argv = ["reconcile", "--since", "1h", "--database", url]
    assert main([*argv, "--conn-id", "openai=openai_batch_default", "--conn-id", "openai=openai_elsewhere"]) == 0
    assert seen == [("openai", "openai_elsewhere", ["k4"])]  # the checkpoints name only that one
    seen.clear()
    assert main([*argv, "--provider", "openai", "--conn-id", "openai=openai_elsewhere"]) == 0
    assert seen == [("openai", "openai_elsewhere", ["k4"])]
    assert main([*argv, "--provider", "../../evil"]) == 2


def test_a_row_of_a_backend_whose_sdk_is_missing_is_skipped(openai_conn, database, monkeypatch, caplog):
    """A row naming a registered backend whose SDK this deployment lacks is reported; the others still run.

    The missing SDK is simulated (the test environment has every SDK): ``hook_class_for`` raises for
    ``bedrock`` what it raises when boto3 is absent.
    """
    from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

    from airflow_batch_provider.hooks import registry

    real = registry.hook_class_for

    def without_boto3(provider: str):
        if provider == "bedrock":
            raise AirflowOptionalProviderFeatureException("install airflow-batch-provider[bedrock]")
        return real(provider)

    monkeypatch.setattr(registry, "hook_class_for", without_boto3)
    url, add = database
    add("batch_submission", {"idempotency_key": "k1", "batch_id": "b1", "provider": "bedrock"})
    add("batch_submission", {"idempotency_key": "k2", "batch_id": "b2", "provider": "openai"}, map_index=1)
    with caplog.at_level(logging.WARNING):
        assert main(["reconcile", "--since", "1h", "--database", url]) == 0
    assert any("chunk 0: provider bedrock cannot be loaded here" in r.getMessage() for r in caplog.records)
