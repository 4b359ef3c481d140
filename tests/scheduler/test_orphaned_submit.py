"""An orphaned submit under a real Airflow 3.3: only the task's *supervisor* is killed.

See :func:`test_kill_supervisor_while_create_in_flight`; the crash-point table is in
docs/durability.md.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.backends.openai.hook import CREATE_TIMEOUT
from tests.scheduler.conftest import DAG_ID
from tests.scheduler.deployment import Deployment
from tests.scheduler.processes import DeploymentError, alive, client_addresses, wait_for
from tests.scheduler.test_crash_safety import CREATE, NUM_CHUNKS, JobRun, Outcome, _run_batches, assert_exactly_once

pytestmark = [pytest.mark.scheduler, pytest.mark.timeout(600)]

HOLD = 3600  # seconds: every create is held until the test releases it (or its client hangs up)
SLOW = 60  # seconds each batch stays in progress, so a late sibling is still live when it is looked at
SIBLING_SLOW = 120  # chunk 1's late sibling runs longer than the batch the sensor follows (see the docstring)
KEY = "airflow_idempotency_key"
BEFORE_CREATE = "lands after the rerun reconciled, before its create"
AFTER_FIRST_LOOK = "lands after the sensor's first look"
PLANS = {0: BEFORE_CREATE, 1: AFTER_FIRST_LOOK}  # chunk -> when its orphan's create is let through


@dataclass
class Orphan:
    """One submit task process whose supervisor was killed, and what the test saw of it."""

    chunk: int
    pid: int
    supervisor: int
    killed_at: float
    calls: dict[int, float] = field(default_factory=dict)  # held create id -> seconds held at last sight
    rerun_call: int | None = None  # the rerun's held create
    batch: str | None = None  # the orphan's batch, once it landed
    landed_at: float | None = None
    exited_at: float | None = None


@pytest.fixture(autouse=True)
def _isolated(deployment: Deployment) -> Iterator[None]:
    """Leave no fault, held call, unfinished run or stopped component behind."""
    yield
    deployment.set_faults()
    deployment.release_held()
    deployment.ensure_running()
    deployment.fail_unfinished_runs(DAG_ID)


def test_kill_supervisor_while_create_in_flight(deployment: Deployment, undisturbed: Outcome) -> None:
    """SIGKILL only a submit's supervisor while its ``POST /v1/batches`` is held; the orphan's create lands late.

    What an orphan does (measured here, Airflow 3.3.2, LocalExecutor): the supervisor is the
    LocalExecutor worker (``airflow worker -- LocalExecutor: <ti id>``) that forked the task process
    (``airflow worker -- <ti id>``); Airflow sets no parent-death signal, so the task process runs
    on. Its channel to the supervisor is dead: anything sent through it (checkpoint, XCom) and any
    structlog logger (an operator's or hook's ``self.log``) raises BrokenPipeError, but stdlib
    ``logging`` swallows the error, so ``utils/retry.py`` can still log a retry. Its held create
    times out after ``CREATE_TIMEOUT`` (60 s: the emulator sees the hang-up and drops the call
    undone), and 1-2 s later it looks the key up (nothing yet) and sends the create again; it may keep doing so until
    ``CREATE_WITHIN`` (180 s), so a create of an orphan can land up to ~240 s after its first try.
    Meanwhile the scheduler fails the try on the heartbeat timeout (60 s here) and retries it
    10 s later: the rerun reconciled and sent its own create ~75 s after the kill, when the
    orphan's *second* create was held. Once its create is answered the orphan exits within a few
    seconds, having written no checkpoint and cancelled nothing. (With Airflow's default
    ``task_instance_heartbeat_timeout`` of 300 s a rerun starts after the orphan's last create
    could land; the race needs a timeout under ~240 s, as this deployment's.)

    Timing: every create is held (``delay_routes``, 3600 s) and the test lets the calls through
    one by one (``POST /_emulator/release``), telling them apart by their client address, which
    it maps to the orphan's or the rerun's process (psutil; the rerun's pid from the REST API).
    Both chunks' supervisors are killed; each chunk's orphan create lands after its rerun
    reconciled, at a different point:

    - chunk 0: when the rerun's create is held (its reconcile found nothing), the orphan's create
      is released and lands, then the rerun's: the rerun's check right after creating cancels
      the orphan's batch (submit try 2 logs "cancelling batch").
    - chunk 1: the rerun's create goes at once; once the sensor has looked (nothing) and deferred,
      the orphan's create lands beside the followed batch, which is still running (``slow``). The
      sensor's check when that batch ends cancels it (wait try 1 logs it). Before that check
      existed both batches completed: one chunk billed twice. The orphan's batch is made to run
      longer (``SIBLING_SLOW``) than the followed one: with equal durations it landed 2 s later,
      ended 2 s later, and had completed by the time the resumed sensor looked (5-10 s after the
      trigger fired), so it could only be logged as billed (see docs/durability.md, known gaps).

    The run must succeed with one completed batch per chunk, the orphan's batch beside it
    ``cancelled`` with the same ``airflow_idempotency_key``, four creates at the emulator (the race
    happened: the test fails rather than pass without it), and the undisturbed run's output.

    OpenAI only: Anthropic batches carry no metadata, so there is no key to find siblings by
    (a rerun adopts the one batch created after its intent, and cancels nothing: a guess must
    never cancel someone's batch); Bedrock creates with ``clientRequestToken`` = the key, so a
    late create of the same job returns the same job instead of a second one.
    """
    chunks = list(range(NUM_CHUNKS))
    orphans: dict[int, Orphan] = {}
    timeline: list[str] = []
    started = time.monotonic()
    cancelled_metric = "llm_batch.duplicate_batches_cancelled"
    cancelled_before = deployment.statsd.counter(cancelled_metric)

    def note(text: str) -> None:
        timeline.append(f"{time.monotonic() - started:6.1f}s {text}")

    try:
        with deployment.faults(delay_routes={CREATE: HOLD}, slow=SLOW):
            job = JobRun(deployment, "orphaned-create")
            job.wait_held("before", CREATE, NUM_CHUNKS)
            for chunk in chunks:
                ti = job.ti("submit", chunk)
                assert ti["state"] == "running", f"submit[{chunk}] is {ti['state']}"
                supervisor, pid = deployment.kill_supervisor(ti)
                orphans[chunk] = Orphan(chunk, pid, supervisor, time.monotonic())
                note(f"submit[{chunk}]: killed supervisor {supervisor}; task process {pid} left running")
            time.sleep(1)
            for orphan in orphans.values():
                assert alive(orphan.pid) and not alive(orphan.supervisor), orphan
            _choreograph(deployment, job, orphans, note)
        for orphan in orphans.values():
            try:
                wait_for(lambda o=orphan: not alive(o.pid), 30, f"orphan {orphan.pid} to exit", 0.2)
                note(f"submit[{orphan.chunk}]: orphan {orphan.pid} exited "
                     f"{time.monotonic() - (orphan.landed_at or 0):.1f} s after its create landed")  # fmt: skip
            except DeploymentError:
                note(f"submit[{orphan.chunk}]: orphan {orphan.pid} still alive 30 s after its create landed")
        outcome = job.finish()
        note("run ended")
    finally:
        for orphan in orphans.values():
            if alive(orphan.pid):
                note(f"orphan {orphan.pid} still alive at the end: killed")
                os.kill(orphan.pid, signal.SIGKILL)
        print("\n".join(timeline))  # the facts the docstring states, for the record (-s shows it)

    job.assert_retried("submit", chunks)
    assert outcome.delta["batches_created"] == 2 * NUM_CHUNKS, "one batch per rerun plus one per orphan"
    kept = _check_siblings(deployment, outcome, orphans)
    assert_exactly_once(dataclasses.replace(outcome, batches=kept), undisturbed)
    assert _task_log(deployment, job.run_id, "submit", 0, 2).count(f"cancelling batch {orphans[0].batch}") == 1
    assert _task_log(deployment, job.run_id, "wait", 1, 1).count(f"cancelling batch {orphans[1].batch}") == 1
    # ... and in the metrics: one cancelled duplicate per chunk (the submit's check and the sensor's).
    wait_for(lambda: deployment.statsd.counter(cancelled_metric) - cancelled_before >= NUM_CHUNKS, 10, "the metric")
    assert deployment.statsd.counter(cancelled_metric) - cancelled_before == NUM_CHUNKS
    for orphan in orphans.values():  # its first create timed out (CREATE_TIMEOUT) and it sent another
        first = orphan.calls[min(orphan.calls)]
        assert len(orphan.calls) >= 2 and first > CREATE_TIMEOUT - 5, f"the orphan's create was not retried: {orphan}"


def _choreograph(deployment: Deployment, job: JobRun, orphans: dict[int, Orphan], note: Any) -> None:
    """Let each rerun's and orphan's held creates through in the order ``PLANS`` names."""
    pending = dict(orphans)
    while pending:
        held = [c for c in deployment.held_calls() if c["request"] == CREATE and c["phase"] == "before"]
        for chunk, orphan in list(pending.items()):
            if _step(deployment, job, orphan, held, note):
                del pending[chunk]
        _check_orphans_alive(pending)
        time.sleep(0.5)


def _step(deployment: Deployment, job: JobRun, orphan: Orphan, held: list[dict[str, Any]], note: Any) -> bool:
    """Advance one chunk's plan by what is held now; True once its orphan's create has landed."""
    chunk = orphan.chunk
    mine = client_addresses(orphan.pid)
    orphan.calls.update({c["id"]: c["held_s"] for c in held if c["client"] in mine})
    if orphan.rerun_call is None:
        orphan.rerun_call = _rerun_call(job, chunk, held)
        if orphan.rerun_call is None:
            return False
        note(f"submit[{chunk}]: the rerun's create is held (it reconciled and found nothing)")
        if PLANS[chunk] == AFTER_FIRST_LOOK:
            deployment.release_held([orphan.rerun_call])
            note(f"submit[{chunk}]: released the rerun's create")
    if PLANS[chunk] == AFTER_FIRST_LOOK and not _first_look_done(job, chunk):
        return False
    if not _land_orphan_create(deployment, job, orphan, held, mine, note):
        return False
    if PLANS[chunk] == BEFORE_CREATE:
        deployment.release_held([orphan.rerun_call])
        note(f"submit[{chunk}]: released the rerun's create")
    return True


def _rerun_call(job: JobRun, chunk: int, held: list[dict[str, Any]]) -> int | None:
    """Return the id of the held create sent by submit[chunk]'s later try, if it is held."""
    ti = job.ti("submit", chunk)
    if ti["try_number"] < 2 or ti["state"] != "running" or not ti.get("pid"):
        return None
    addresses = client_addresses(int(ti["pid"]))
    return next((c["id"] for c in held if c["client"] in addresses), None)


def _first_look_done(job: JobRun, chunk: int) -> bool:
    """Whether wait[chunk] has looked at its batch (and cancelled nothing) and deferred."""
    tis = [ti for ti in job.tis("wait") if ti["map_index"] == chunk]
    return bool(tis) and tis[0]["state"] == "deferred"


def _land_orphan_create(
    deployment: Deployment, job: JobRun, orphan: Orphan, held: list[dict[str, Any]], mine: set[str], note: Any
) -> bool:
    """Release the orphan's held create and wait for its batch; False if it has none held right now."""
    call = next((c for c in held if c["client"] in mine), None)
    if call is None:  # between two attempts (its client timed out and it waits to retry)
        return False
    before = {b["id"] for b in _chunk_batches(deployment, job.run_id, orphan.chunk)}
    if PLANS[orphan.chunk] == AFTER_FIRST_LOOK:  # batches take their ``slow`` from the faults when created
        deployment.set_faults(delay_routes={CREATE: HOLD}, slow=SIBLING_SLOW)
    deployment.release_held([call["id"]])
    try:
        new = wait_for(
            lambda: {b["id"] for b in _chunk_batches(deployment, job.run_id, orphan.chunk)} - before,
            5,
            f"the orphan's create for chunk {orphan.chunk} to land",
            0.1,
        )
    except DeploymentError:  # it hung up (timed out) just as it was released: wait for its next attempt
        note(f"submit[{orphan.chunk}]: the orphan's call {call['id']} was abandoned as it was released")
        return False
    finally:
        deployment.set_faults(delay_routes={CREATE: HOLD}, slow=SLOW)
    orphan.batch = new.pop()
    orphan.landed_at = time.monotonic()
    live = [b["status"] for b in _chunk_batches(deployment, job.run_id, orphan.chunk) if b["id"] != orphan.batch]
    note(f"submit[{orphan.chunk}]: the orphan's create (held {call['held_s']:.0f} s) landed as {orphan.batch} "
         f"({PLANS[orphan.chunk]}); the rerun's batch: {live}")  # fmt: skip
    if PLANS[orphan.chunk] == AFTER_FIRST_LOOK:
        assert live == ["in_progress"], f"the rerun's batch must still be running when the orphan's lands: {live}"
    return True


def _check_orphans_alive(pending: dict[int, Orphan]) -> None:
    for orphan in pending.values():
        if not alive(orphan.pid):
            raise DeploymentError(
                f"orphan of submit[{orphan.chunk}] (pid {orphan.pid}) exited before its create could land "
                f"after the rerun's reconcile; held creates it sent: {orphan.calls}"
            )
        idle = time.monotonic() - orphan.killed_at
        if idle > 400:
            raise DeploymentError(f"the rerun of submit[{orphan.chunk}] did not send its create in {idle:.0f} s")


def _chunk_batches(deployment: Deployment, run_id: str, chunk: int) -> list[dict[str, Any]]:
    return [b for b in _run_batches(deployment, run_id) if b["metadata"].get("airflow_task") == f"submit[{chunk}]"]


def _check_siblings(deployment: Deployment, outcome: Outcome, orphans: dict[int, Orphan]) -> list[dict[str, Any]]:
    """Each chunk: its orphan's batch cancelled, same key as the one kept batch. Return the kept batches."""

    def settled() -> list[dict[str, Any]]:
        batches = _run_batches(deployment, outcome.run_id)
        return [] if any(b["status"] == "cancelling" for b in batches) else batches

    batches = wait_for(settled, 30, "the cancelled siblings to settle", 0.5)
    kept = [b for b in batches if b["status"] != "cancelled"]
    for chunk, orphan in orphans.items():
        mine = [b for b in batches if b["metadata"]["airflow_task"] == f"submit[{chunk}]"]
        summary = [(b["id"], b["status"], b["metadata"][KEY]) for b in mine]
        assert len(mine) == 2 and len({b["metadata"][KEY] for b in mine}) == 1, summary
        cancelled = [b["id"] for b in mine if b["status"] == "cancelled"]
        assert cancelled == [orphan.batch], f"chunk {chunk}: only the orphan's batch must be cancelled: {summary}"
    return kept


def _task_log(deployment: Deployment, run_id: str, task_id: str, map_index: int, try_number: int) -> str:
    """Return the text of one try's task log."""
    pattern = f"run_id={run_id}/task_id={task_id}/map_index={map_index}/attempt={try_number}.log"
    paths = list((deployment.home / "logs").glob(f"*/{pattern}"))
    assert len(paths) == 1, f"no single log at */{pattern}: {paths}"
    return Path(paths[0]).read_text(errors="replace")
