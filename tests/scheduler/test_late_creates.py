"""Creates whose outcome is unknown, under a real Airflow 3.3 (the deployment of test_orphaned_submit).

The emulator runs every create whose answer it then loses (``lose_answer_routes``): the batch
exists, the client got a 500. OpenAI must look the key up instead of creating a second batch;
Anthropic must not resend, and its retry must adopt only its own batch among equal-size ones. A
create landing *after* the run (a slow proxy delivering the first attempt) is cancelled by
``python -m airflow_batch_provider.jobs reconcile``, with an ALERT line and its metrics (the
deployment sends StatsD to the suite's listener). For OpenAI a late create landing *during* the run
is test_orphaned_submit's case (the sensor's first and last look); for Anthropic, whose batches carry
no key, :func:`test_anthropic_late_creates_during_and_after_the_run_are_cancelled_by_reconcile`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx
import openai
import pytest

from tests.scheduler.conftest import DAG_ID
from tests.scheduler.deployment import EMULATOR_KEY, Deployment
from tests.scheduler.processes import wait_for
from tests.scheduler.test_crash_safety import (
    CREATE,
    NUM_CHUNKS,
    RUN_TIMEOUT,
    Backend,
    JobRun,
    Outcome,
    assert_exactly_once,
)

pytestmark = [pytest.mark.scheduler, pytest.mark.timeout(600)]

# 20,000 rows: two chunks of exactly 10,000, the same size, as the Anthropic case needs.
ANTHROPIC = Backend("anthropic", 20_000, "POST /v1/messages/batches", "ended", ("in_progress",), "anthropic")


@pytest.fixture(autouse=True)
def _isolated(deployment: Deployment) -> Any:
    """Leave no fault, held call or unfinished run behind."""
    yield
    deployment.set_faults()
    deployment.release_held()
    deployment.fail_unfinished_runs(DAG_ID)


def _reconcile(deployment: Deployment, *providers: str) -> str:
    """Run ``jobs reconcile --since 1h`` as the maintenance DAG does; return its output."""
    args = [arg for provider in providers for arg in ("--provider", provider)]
    done = subprocess.run(
        [sys.executable, "-m", "airflow_batch_provider.jobs", "reconcile", "--since", "1h", *args],
        env=deployment.env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _counted(deployment: Deployment) -> dict[str, int]:
    names = ("llm_batch.late_duplicate_batches", "llm_batch.duplicate_batches_cancelled")
    return {name: deployment.statsd.counter(name) for name in names}


def _lost(deployment: Deployment) -> int:
    return int(deployment.emulator_get("/_emulator/stats")["http"].get("answers_lost", 0))


def test_openai_lost_answers_make_no_second_batch_and_a_late_create_is_cancelled_after_the_run(
    deployment: Deployment, undisturbed: Outcome
) -> None:
    lost_before = _lost(deployment)
    with deployment.faults(lose_answer_routes={CREATE: NUM_CHUNKS}):
        outcome = JobRun(deployment, "lost-answer").finish()
    assert _lost(deployment) - lost_before == NUM_CHUNKS, "every chunk's first create lost its answer"
    assert outcome.delta["batches_created"] == NUM_CHUNKS, "a create whose answer was lost was sent again"
    assert_exactly_once(outcome, undisturbed)

    # The run is over. Now chunk 0's first create, held on the way, reaches the provider.
    client = openai.OpenAI(api_key=EMULATOR_KEY, base_url=f"{deployment.emulator_url}/v1", max_retries=0)
    kept = next(b for b in outcome.batches if b["metadata"]["airflow_task"] == "submit[0]")
    original = client.batches.retrieve(kept["id"])
    deployment.set_faults(slow=300)  # the late batch would run long after the check
    late = client.batches.create(input_file_id=original.input_file_id, endpoint=original.endpoint,  # type: ignore[arg-type]
                                 completion_window="24h", metadata=original.metadata).id  # fmt: skip
    counted = _counted(deployment)
    started = time.monotonic()
    out = _reconcile(deployment, "openai")
    print(f"jobs reconcile took {time.monotonic() - started:.1f} s:\n{out}")
    assert f"ALERT late duplicate openai batch {late}: " in out, out
    assert f"served by batch {kept['id']}; cancelled" in out
    assert "1 late duplicate batch(es) found in the last 1h; 1 cancelled" in out
    wait_for(lambda: _counted(deployment) != counted, 10, "the reconcile's metrics")
    assert {k: v - counted[k] for k, v in _counted(deployment).items()} == {
        "llm_batch.late_duplicate_batches": 1,
        "llm_batch.duplicate_batches_cancelled": 1,
    }
    status = wait_for(lambda: client.batches.retrieve(late).status in ("cancelled",), 30, "the late batch's cancel")
    assert status
    for batch in outcome.batches:  # the run's own batches are untouched
        assert client.batches.retrieve(batch["id"]).status == "completed"


def test_anthropic_lost_answers_adopt_only_their_own_batch_among_equal_size_ones(deployment: Deployment) -> None:
    before = {b["id"] for b in deployment.emulator_get("/_emulator/batches")["data"]}
    lost_before = _lost(deployment)
    with deployment.faults(lose_answer_routes={ANTHROPIC.create: NUM_CHUNKS}):
        job = JobRun(deployment, "lost-answer-anthropic", ANTHROPIC)
        state = deployment.wait_for_run(DAG_ID, job.run_id, RUN_TIMEOUT)
    assert state == "success", f"run {job.run_id} ended {state}: {job.states()}"
    assert _lost(deployment) - lost_before == NUM_CHUNKS
    job.assert_retried("submit", list(range(NUM_CHUNKS)))  # never resent in the task: its retry reconciled

    listing = deployment.emulator_get("/_emulator/batches?custom_ids=1")["data"]
    new = [b for b in listing if b["id"] not in before and b["provider"] == "anthropic"]
    summary = [(b["id"], b["status"], b["custom_id_count"]) for b in new]
    assert len(new) == NUM_CHUNKS, f"one batch per chunk, none sent twice: {summary}"
    assert all(b["status"] == ANTHROPIC.done for b in new) and {b["custom_id_count"] for b in new} == {10_000}
    batch_of = {cid: b["id"] for b in new for cid in b["custom_ids"]}
    assert len(batch_of) == ANTHROPIC.rows, "each row sent in exactly one batch"

    import pyarrow.parquet as pq

    table = pq.read_table(job.output_dir)
    ids = table.column("custom_id").to_pylist()
    assert len(ids) == ANTHROPIC.rows == len(set(ids))
    assert set(table.column("status").to_pylist()) == {"succeeded"}
    # No chunk adopted another's batch: every row's result comes from the batch that holds its request.
    assert table.column("batch_id").to_pylist() == [batch_of[cid] for cid in ids]


def _held_ids(deployment: Deployment, route: str) -> set[int]:
    return {call["id"] for call in deployment.held_calls() if call["request"] == route}


def _anthropic_batches(deployment: Deployment, before: set[str]) -> list[dict[str, Any]]:
    listing = deployment.emulator_get("/_emulator/batches?custom_ids=1")["data"]
    return [b for b in listing if b["id"] not in before and b["provider"] == "anthropic"]


def test_anthropic_late_creates_during_and_after_the_run_are_cancelled_by_reconcile(deployment: Deployment) -> None:
    """Both chunks' first creates are held on the way (a slow proxy) and their task processes killed: the
    retries, finding only an intent, record the create as unsure and send their own. Chunk 0's first create
    then lands while the run waits, chunk 1's after the run succeeded. Each time ``jobs reconcile`` cancels the
    stray (no checkpoint names it; it has the unsure create's size and came after it), with an ALERT line and
    its metrics; the run's own batches are untouched and no chunk adopts another's."""
    route = ANTHROPIC.create
    before = {b["id"] for b in deployment.emulator_get("/_emulator/batches")["data"]}
    counted = _counted(deployment)
    held = {"delay_routes": {route: 3600}, "process_after_hangup": True}
    deployment.set_faults(**held, slow=86_400.0)  # the run's batches wait until the hurry below
    job = JobRun(deployment, "late-anthropic", ANTHROPIC)
    job.wait_held("before", route, NUM_CHUNKS)
    first = _held_ids(deployment, route)
    job.kill("submit", list(range(NUM_CHUNKS)))  # their creates stay held, clients gone: they will land late
    job.wait_until(lambda: len(_held_ids(deployment, route) - first) == NUM_CHUNKS, "the retries' creates")
    deployment.release_held(sorted(_held_ids(deployment, route) - first))  # both retries checked before either landed
    job.wait_until(lambda: len(_anthropic_batches(deployment, before)) == NUM_CHUNKS, "the retries' batches")
    served = {b["id"] for b in _anthropic_batches(deployment, before)}

    orphans = sorted(first)  # by id: chunk order does not matter, each is some chunk's first create
    deployment.release_held(orphans[:1])  # lands during the run
    job.wait_until(lambda: len(_anthropic_batches(deployment, before)) == NUM_CHUNKS + 1, "the first late create")
    (late_during,) = {b["id"] for b in _anthropic_batches(deployment, before)} - served
    assert deployment.run_state(DAG_ID, job.run_id) == "running"
    out = _reconcile(deployment, "anthropic")
    print(out)
    assert f"ALERT late duplicate anthropic batch {late_during}: no checkpoint names it" in out, out
    assert "1 late duplicate batch(es) found in the last 1h; 1 cancelled" in out

    httpx.post(f"{deployment.emulator_url}/_emulator/hurry", timeout=30).raise_for_status()
    state = deployment.wait_for_run(DAG_ID, job.run_id, RUN_TIMEOUT)
    assert state == "success", f"run {job.run_id} ended {state}: {job.states()}"
    deployment.set_faults(**held, slow=300.0)  # the second late batch would run on
    deployment.release_held(orphans[1:])  # lands after the run
    wait_for(lambda: len(_anthropic_batches(deployment, before)) == NUM_CHUNKS + 2, 60, "the second late create")
    (late_after,) = {b["id"] for b in _anthropic_batches(deployment, before)} - served - {late_during}
    out = _reconcile(deployment, "anthropic")
    print(out)
    assert f"ALERT late duplicate anthropic batch {late_after}: no checkpoint names it" in out, out
    assert "1 late duplicate batch(es) found in the last 1h; 1 cancelled" in out

    wait_for(lambda: _counted(deployment)["llm_batch.duplicate_batches_cancelled"]
             - counted["llm_batch.duplicate_batches_cancelled"] >= 2, 10, "the reconciles' metrics")  # fmt: skip
    assert {k: v - counted[k] for k, v in _counted(deployment).items()} == {
        "llm_batch.late_duplicate_batches": 2,
        "llm_batch.duplicate_batches_cancelled": 2,
    }
    import anthropic

    client = anthropic.Anthropic(api_key=EMULATOR_KEY, base_url=deployment.emulator_url, max_retries=0)
    batches = {b["id"]: b for b in _anthropic_batches(deployment, before)}
    cancelled = {i for i in batches if client.messages.batches.retrieve(i).cancel_initiated_at is not None}
    assert cancelled == {late_during, late_after}, [(i, b["status"]) for i, b in batches.items()]
    assert all(batches[i]["status"] == ANTHROPIC.done for i in served)
    batch_of = {cid: i for i in served for cid in batches[i]["custom_ids"]}
    assert len(batch_of) == ANTHROPIC.rows, "each row sent once among the served batches"

    import pyarrow.parquet as pq

    table = pq.read_table(job.output_dir)
    ids = table.column("custom_id").to_pylist()
    assert len(ids) == ANTHROPIC.rows == len(set(ids))
    assert table.column("batch_id").to_pylist() == [batch_of[cid] for cid in ids]  # no chunk adopted another's
