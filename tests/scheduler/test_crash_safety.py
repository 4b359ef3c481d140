"""Crash safety of the example DAG under a real Airflow 3.3 (PostgreSQL, LocalExecutor, triggerer).

Each crash test stops the job at a known point with an emulator route delay, SIGKILLs the process
doing the work there, lets Airflow's retry (or a fresh triggerer) carry on, and then demands the
same outcome as an undisturbed run:

- the run ends ``success``;
- the emulator holds exactly one batch per chunk for the run, none cancelled, none duplicated,
  and together they carry every row's custom_id once;
- the merged dataset holds every source row once, equal (all columns but ``batch_id``) to the
  undisturbed run's, and each row's ``batch_id`` is its chunk's one batch.

Crash points (the kill lands while the emulator holds the named call):

==================  ===========================================  ==========================================
stage               how it is reached                            what the retry must do
==================  ===========================================  ==========================================
after upload        ``POST /v1/batches`` held *before* it runs;  reuse the uploaded file (checkpointed),
                    the killed client's create never happens     find no batch, create exactly one
after create,       ``POST /v1/batches`` held *after* it ran:    reconcile through the batch metadata's
before checkpoint   the batch exists, its id never reached the   idempotency key and reattach: no second
                    task, so the checkpoint lacks it             batch
while deferred      the sensor is deferred (no worker process    a new triggerer adopts the trigger; the
                    exists in Airflow 3.3), so the triggerer is  batch is neither cancelled nor resubmitted
                    SIGKILLed and a new one started
mid-merge           ``GET /v1/files/{id}/content`` held while    rewrite the same part files: no duplicate
                    the merge task streams results              rows, no new batch
==================  ===========================================  ==========================================

The first three crash points run for Amazon Bedrock too (``provider="bedrock"``): the held call is
``POST /model-invocation-job``; after upload the retry finds the chunk already in S3 and creates
one job; after create the retry finds the job by its name and ``clientRequestToken``; a new
triggerer resumes polling. (The merge reads Bedrock results from S3, not through the emulator, so
there is no emulator route to hold mid-merge.)

Plus: clearing a finished run through the REST API and letting it run again creates no batch,
uploads nothing and sends no request — cleared from ``submit`` on (the checkpoint path) and cleared
whole (the chunk step's ``skip_unchanged`` carries every stored row).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_emulator.examples import synthetic_products
from airflow_batch_provider.chunking.ids import derive_custom_id
from tests.scheduler.conftest import DAG_ID
from tests.scheduler.deployment import Deployment
from tests.scheduler.processes import DeploymentError, wait_for

pytestmark = [pytest.mark.scheduler, pytest.mark.timeout(420)]

ROWS = 10_050  # the DAG chunks by 10,000: two chunks, so two mapped submit and wait tasks
NUM_CHUNKS = 2
RUN_TIMEOUT = 240.0
HOLD = 120  # seconds a delayed call is held; the kill ends it long before
SLOW = 35  # seconds a batch stays in progress in the triggerer test
POKE_GRACE = 15  # a sensor running this long without deferring is poking
CREATE = "POST /v1/batches"
CONTENT = "GET /v1/files/{file_id}/content"
STAT_KEYS = {
    "files_uploaded": ("openai", "files_uploaded"),
    "batches_created": ("openai", "batches_created"),
    "requests_processed": ("openai", "requests_processed"),
    "delayed_abandoned": ("http", "delayed_abandoned"),
}


@dataclass(frozen=True)
class Backend:
    """What the crash tests need to know of one provider: its rows, held route and emulator names."""

    provider: str
    rows: int  # two chunks of the DAG's 10,000
    create: str  # the emulator route that creates a batch
    done: str  # the emulator's status of a finished batch
    live: tuple[str, ...]  # its statuses of a batch still running
    stat_section: str

    def task(self, map_index: int) -> str:
        """The ``airflow_task`` metadata of chunk ``map_index``'s batch (Bedrock tag values cannot hold brackets)."""
        return f"submit[{map_index}]" if self.provider == "openai" else f"submit_{map_index}_"

    def custom_id(self, product_id: str) -> str:
        """The id a row is sent under: Bedrock record ids are alphanumeric, so "p-00000001" is derived."""
        return product_id if self.provider == "openai" else derive_custom_id(product_id, "")


OPENAI = Backend("openai", ROWS, CREATE, "completed", ("validating", "in_progress"), "openai")
# Bedrock merges a last chunk under its 100-record minimum into the one before: 10,150 rows make 10,000 + 150.
BEDROCK = Backend(
    "bedrock",
    10_150,
    "POST /model-invocation-job",
    "Completed",
    ("Submitted", "Validating", "Scheduled", "InProgress"),
    "bedrock",
)
BACKENDS = pytest.mark.parametrize("backend", [OPENAI, BEDROCK], ids=["openai", "bedrock"])


@dataclass
class Outcome:
    """What one DAG run left behind."""

    run_id: str
    output: pa.Table
    batches: list[dict[str, Any]]
    delta: dict[str, int]
    output_dir: Path
    task_instances: list[dict[str, Any]] = field(default_factory=list)


def _counters(deployment: Deployment, backend: Backend = OPENAI) -> dict[str, int]:
    stats = deployment.emulator_get("/_emulator/stats")
    counts = {}
    for name, (section, key) in STAT_KEYS.items():
        section = backend.stat_section if section == "openai" else section
        counts[name] = int(stats[section].get(key, 0))
    if backend.provider == "bedrock":  # uploads go to S3, not through the emulator
        counts["files_uploaded"] = deployment.bedrock_inputs()
    return counts


_POLL_COUNTERS = ("polls", "held")  # how often a batch's status was read: not part of what was billed


def _run_batches(deployment: Deployment, run_id: str) -> list[dict[str, Any]]:
    listing = deployment.emulator_get("/_emulator/batches?custom_ids=1")["data"]
    return [
        {key: value for key, value in b.items() if key not in _POLL_COUNTERS}
        for b in listing
        if (b.get("metadata") or {}).get("airflow_run_id") == run_id
    ]


class JobRun:
    """One triggered run of the example DAG, with the emulator counters from before it started."""

    def __init__(self, deployment: Deployment, name: str, backend: Backend = OPENAI) -> None:
        self.deployment = deployment
        self.backend = backend
        self.run_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.output_dir = deployment.root / "out" / self.run_id
        self.before = _counters(deployment, backend)
        deployment.trigger(
            DAG_ID,
            self.run_id,
            {
                "rows": backend.rows,
                "data_dir": str(deployment.data_dir / backend.provider),
                "output_dir": str(self.output_dir),
                "poll_interval": 0.5,
                "provider": backend.provider,
            },
        )

    def ti(self, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """Return one task instance of this run."""
        return self.deployment.task_instance(DAG_ID, self.run_id, task_id, map_index)

    def tis(self, task_id: str) -> list[dict[str, Any]]:
        """Return the task instances of ``task_id`` (none for a mapped task not expanded yet)."""
        return [ti for ti in self.deployment.task_instances(DAG_ID, self.run_id) if ti["task_id"] == task_id]

    def wait_until(self, check: Callable[[], bool], what: str, timeout: float = 150) -> None:
        """Wait for ``check``; fail early, with the task states, if the run ends first."""

        def probe() -> bool:
            if check():
                return True
            state = self.deployment.run_state(DAG_ID, self.run_id)
            if state in ("success", "failed"):
                raise DeploymentError(f"run {self.run_id} ended {state} before {what}: {self.states()}")
            return False

        wait_for(probe, timeout, what)

    def wait_held(self, phase: str, route: str, count: int) -> None:
        """Wait until the emulator holds ``count`` calls of ``route`` in ``phase`` (before/after)."""
        prefix = route.split("{")[0]

        def held() -> bool:
            calls = self.deployment.emulator_get("/_emulator/stats")["http"]["delayed_in_flight"]
            return sum(c["count"] for c in calls if c["phase"] == phase and c["request"].startswith(prefix)) >= count

        self.wait_until(held, f"{count} {route!r} call(s) held {phase} the route")

    def kill(self, task_id: str, map_indexes: list[int]) -> None:
        """SIGKILL the task processes of ``task_id`` at ``map_indexes`` (they must be running)."""
        for map_index in map_indexes:
            ti = self.ti(task_id, map_index)
            assert ti["state"] == "running", f"{task_id}[{map_index}] is {ti['state']}, expected running"
            self.deployment.kill_task_process(ti)

    def states(self) -> dict[str, str]:
        """Return ``{task[map_index]: state}`` of the run's task instances."""
        return {
            f"{ti['task_id']}[{ti['map_index']}]": f"{ti['state']} (try {ti['try_number']})"
            for ti in self.deployment.task_instances(DAG_ID, self.run_id)
        }

    def finish(self) -> Outcome:
        """Wait for the run to end; it must succeed. Return what it left behind."""
        state = self.deployment.wait_for_run(DAG_ID, self.run_id, RUN_TIMEOUT)
        assert state == "success", f"run {self.run_id} ended {state}: {self.states()}"
        after = _counters(self.deployment, self.backend)
        return Outcome(
            run_id=self.run_id,
            output=pq.read_table(self.output_dir),
            batches=_run_batches(self.deployment, self.run_id),
            delta={key: after[key] - self.before[key] for key in after},
            output_dir=self.output_dir,
            task_instances=self.deployment.task_instances(DAG_ID, self.run_id),
        )

    def assert_retried(self, task_id: str, map_indexes: list[int]) -> None:
        """The killed try is recorded failed and a later try succeeded."""
        for map_index in map_indexes:
            tries = self.deployment.tries(DAG_ID, self.run_id, task_id, map_index)
            states = [t["state"] for t in tries]
            assert len(tries) >= 2 and states[0] == "failed" and states[-1] == "success", (
                f"{task_id}[{map_index}] tries: {states}"
            )


def assert_exactly_once(outcome: Outcome, reference: Outcome | None, backend: Backend = OPENAI) -> None:
    """One live batch per chunk, every row once, and the undisturbed run's output."""
    batches = outcome.batches
    rows = backend.rows
    summary = [(b["id"], b["status"], b["metadata"].get("airflow_task")) for b in batches]
    assert all(b["status"] == backend.done for b in batches), f"a batch did not complete (or was cancelled): {summary}"
    per_chunk = sorted(b["metadata"]["airflow_task"] for b in batches)
    assert per_chunk == [backend.task(i) for i in range(NUM_CHUNKS)], f"batches per chunk: {summary}"
    sent = [cid for b in batches for cid in b["custom_ids"]]
    source_ids = synthetic_products(rows).column("product_id").to_pylist()
    expected = [backend.custom_id(pid) for pid in source_ids]
    assert len(sent) == rows and set(sent) == set(expected), "each row must be sent in exactly one batch"

    table = outcome.output
    ids = table.column("custom_id").to_pylist()
    assert len(ids) == rows and len(set(ids)) == rows and set(ids) == set(expected)
    assert dict(zip(ids, table.column("product_id").to_pylist())) == dict(zip(expected, source_ids))
    assert set(table.column("status").to_pylist()) == {"succeeded"}
    batch_of = {cid: b["id"] for b in batches for cid in b["custom_ids"]}
    assert table.column("batch_id").to_pylist() == [batch_of[cid] for cid in ids]
    files = sorted(p.name for p in outcome.output_dir.iterdir())
    assert files == ["_REPORT.html", "_SUMMARY.json", *(f"part-{i:05d}.parquet" for i in range(NUM_CHUNKS))], files
    summary_file = json.loads((outcome.output_dir / "_SUMMARY.json").read_text())
    assert summary_file["rows"] == rows and sorted(summary_file["batch_ids"]) == sorted(b["id"] for b in batches)
    if reference is not None:
        got, want = _comparable(table), _comparable(reference.output)
        assert got.equals(want), f"output differs from the undisturbed run: {_differences(got, want)}"


def _differences(got: pa.Table, want: pa.Table) -> str:
    """Say which columns differ between two outputs (and the first differing row of each)."""
    if got.column_names != want.column_names:
        return f"columns {got.column_names} != {want.column_names}"
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows != {want.num_rows}"
    notes = []
    for name in got.column_names:
        a, b = got.column(name).to_pylist(), want.column(name).to_pylist()
        if a != b:
            first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            diff = sum(x != y for x, y in zip(a, b))
            notes.append(f"{name}: {diff} row(s), first at {first}: {a[first]!r} != {b[first]!r}")
    return "; ".join(notes) or f"schemas differ: {got.schema} vs {want.schema}"


def _comparable(table: pa.Table) -> pa.Table:
    """The output without ``batch_id`` (it names this run's batches), in custom_id order."""
    return table.drop_columns(["batch_id"]).sort_by("custom_id").combine_chunks()


@pytest.fixture(autouse=True)
def _isolated(deployment: Deployment) -> Iterator[None]:
    """Leave no fault, unfinished run or stopped component behind for the next test."""
    yield
    deployment.set_faults()
    deployment.ensure_running()
    deployment.fail_unfinished_runs(DAG_ID)


@pytest.fixture(scope="module")
def undisturbed_bedrock(deployment: Deployment) -> Outcome:
    """The undisturbed reference run on Bedrock."""
    return JobRun(deployment, "undisturbed-bedrock", BEDROCK).finish()


def _reference(request: pytest.FixtureRequest, backend: Backend) -> Outcome:
    return request.getfixturevalue("undisturbed" if backend is OPENAI else "undisturbed_bedrock")


def test_undisturbed_bedrock_run(undisturbed_bedrock: Outcome) -> None:
    """A plain Bedrock run: one job per chunk, each chunk uploaded once, every row once."""
    assert_exactly_once(undisturbed_bedrock, None, BEDROCK)
    assert undisturbed_bedrock.delta["files_uploaded"] == NUM_CHUNKS
    assert undisturbed_bedrock.delta["batches_created"] == NUM_CHUNKS
    assert undisturbed_bedrock.delta["requests_processed"] == BEDROCK.rows
    assert {ti["try_number"] for ti in undisturbed_bedrock.task_instances} == {1}


def test_undisturbed_run(undisturbed: Outcome) -> None:
    """A plain run succeeds with one batch per chunk and every row once.

    This is also the suite's guard against task code that touches the metadata DB directly
    (``settings.Session()``, ``provide_session``...): ``dag.test()`` allows it, but under a real
    scheduler the task fails with "Direct database access via the ORM is not allowed", so this
    run would not succeed.
    """
    assert_exactly_once(undisturbed, None)
    assert undisturbed.delta["files_uploaded"] == NUM_CHUNKS
    assert undisturbed.delta["batches_created"] == NUM_CHUNKS
    assert undisturbed.delta["requests_processed"] == ROWS
    assert {ti["try_number"] for ti in undisturbed.task_instances} == {1}


def _clear_and_rerun(deployment: Deployment, run: Outcome, from_task: str | None) -> tuple[pa.Table, pa.Table]:
    """Clear a finished run (all of it, or ``from_task`` downstream), let it run again, demand it bills nothing.

    Return the output before and after, in custom_id order.
    """
    before_output = pq.read_table(run.output_dir).sort_by("custom_id").combine_chunks()
    before_batches = _run_batches(deployment, run.run_id)
    before = _counters(deployment)
    deployment.clear_run(DAG_ID, run.run_id, from_task=from_task)
    assert deployment.wait_for_run(DAG_ID, run.run_id, RUN_TIMEOUT) == "success"
    after = _counters(deployment)
    billed = {key: after[key] - before[key] for key in ("files_uploaded", "batches_created", "requests_processed")}
    assert billed == {"files_uploaded": 0, "batches_created": 0, "requests_processed": 0}
    assert _run_batches(deployment, run.run_id) == before_batches  # none cancelled either
    cleared = [
        ti for ti in deployment.task_instances(DAG_ID, run.run_id) if from_task is None or ti["task_id"] != "chunk"
    ]
    assert {ti["state"] for ti in cleared} == {"success"}
    assert all(ti["try_number"] >= 2 for ti in cleared if ti["task_id"] != "make_products" or from_task is None), (
        "every cleared task must really have run again"
    )
    return before_output, pq.read_table(run.output_dir).sort_by("custom_id").combine_chunks()


def test_clear_from_submit_reattaches_through_the_checkpoint(deployment: Deployment, undisturbed: Outcome) -> None:
    """Clearing submit and everything after it reruns them on the same chunks: submit finds its checkpointed
    batch id and reattaches, the sensor finds the batch done, the merge rewrites the same parts."""
    before, after = _clear_and_rerun(deployment, undisturbed, "submit")
    assert after.equals(before), f"the rerun changed the output: {_differences(after, before)}"


def test_clear_whole_run_bills_nothing(deployment: Deployment, undisturbed: Outcome) -> None:
    """Clearing the whole run (the UI's "Clear" on a run) reruns the chunk step too; no row is billed again.

    The example DAG chunks with ``skip_unchanged=True`` into its own output folder, so the rerun finds
    every row stored with the same request fingerprint and carries it (``attempts`` 0 = carried, not
    sent); everything else in the output stays as it was.
    """
    before, after = _clear_and_rerun(deployment, undisturbed, None)
    assert set(after.column("attempts").to_pylist()) <= {0, 1}
    rest = [name for name in after.column_names if name != "attempts"]
    assert after.select(rest).equals(before.select(rest)), (
        f"the rerun changed the output: {_differences(after.select(rest), before.select(rest))}"
    )


@BACKENDS
def test_kill_after_upload_before_batch_create(
    deployment: Deployment, backend: Backend, request: pytest.FixtureRequest
) -> None:
    """Killed while the create call is in flight but not yet run: the retry reuses the upload."""
    undisturbed = _reference(request, backend)
    chunks = list(range(NUM_CHUNKS))
    with deployment.faults(delay_routes={backend.create: HOLD}):
        job = JobRun(deployment, "kill-after-upload", backend)
        job.wait_held("before", backend.create, NUM_CHUNKS)
        assert _run_batches(deployment, job.run_id) == []
        job.kill("submit", chunks)
    outcome = job.finish()
    job.assert_retried("submit", chunks)
    assert outcome.delta["delayed_abandoned"] == NUM_CHUNKS  # the held creates were dropped undone
    assert outcome.delta["files_uploaded"] == NUM_CHUNKS  # uploaded once, reused by the retry
    assert outcome.delta["batches_created"] == NUM_CHUNKS
    assert_exactly_once(outcome, undisturbed, backend)


@BACKENDS
def test_kill_after_batch_create_before_checkpoint(
    deployment: Deployment, backend: Backend, request: pytest.FixtureRequest
) -> None:
    """Killed after the batch exists but before its id is checkpointed: the retry reconciles."""
    undisturbed = _reference(request, backend)
    chunks = list(range(NUM_CHUNKS))
    with deployment.faults(delay_after_routes={backend.create: HOLD}):
        job = JobRun(deployment, "kill-after-create", backend)
        job.wait_held("after", backend.create, NUM_CHUNKS)
        assert len(_run_batches(deployment, job.run_id)) == NUM_CHUNKS  # created, id not yet told
        job.kill("submit", chunks)
    outcome = job.finish()
    job.assert_retried("submit", chunks)
    assert outcome.delta["delayed_abandoned"] == NUM_CHUNKS  # the answers carrying the ids were lost
    assert outcome.delta["files_uploaded"] == NUM_CHUNKS
    assert outcome.delta["batches_created"] == NUM_CHUNKS, "the retry created a second batch"
    assert_exactly_once(outcome, undisturbed, backend)


class SensorPokedError(AssertionError):
    """The sensor kept a worker process polling instead of deferring to the triggerer."""


@BACKENDS
def test_kill_triggerer_while_deferred(
    deployment: Deployment, backend: Backend, request: pytest.FixtureRequest
) -> None:
    """SIGKILL the triggerer while every sensor is deferred; a new triggerer finishes the wait.

    In Airflow 3.3 a deferred task instance has no process at all: its worker process exited when
    it deferred, and the wait runs as a trigger inside the triggerer. "Killed while deferred" is
    therefore a triggerer crash. It must not cancel the batch (the trigger's ``on_kill`` is only
    for a user acting on the task) nor resubmit it, and the sensor resumes without a retry.
    The deployment turns Airflow's ``[operators] default_deferrable`` on and the DAG passes no
    ``deferrable``, so this is also the test that the sensor follows that setting in a real deployment.
    """
    undisturbed = _reference(request, backend)
    triggerer = deployment.components["triggerer"]
    with deployment.faults(slow=SLOW):  # batches stay in progress long enough to kill mid-wait
        job = JobRun(deployment, "kill-triggerer", backend)
        job.wait_until(_sensors_deferred(job), "every sensor to be deferred on a triggerer")
    triggerer.kill(signal.SIGKILL)
    assert triggerer.process is not None
    triggerer.process.wait(timeout=30)
    live = _run_batches(deployment, job.run_id)
    assert len(live) == NUM_CHUNKS and all(b["status"] in backend.live for b in live), live
    triggerer.start()
    outcome = job.finish()
    for map_index in range(NUM_CHUNKS):
        tries = deployment.tries(DAG_ID, job.run_id, "wait", map_index)
        assert [t["state"] for t in tries] == ["success"], "the sensor must resume, not retry"
    assert outcome.delta["batches_created"] == NUM_CHUNKS
    assert_exactly_once(outcome, undisturbed, backend)


def _sensors_deferred(job: JobRun) -> Callable[[], bool]:
    """Return a check: every sensor deferred on a triggerer; raise SensorPokedError if one keeps running."""
    running_since: dict[int, float] = {}

    def check() -> bool:
        tis = job.tis("wait")
        now = time.monotonic()
        for ti in tis:
            if ti["state"] == "running":
                since = running_since.setdefault(ti["map_index"], now)
                if now - since > POKE_GRACE:
                    raise SensorPokedError(
                        f"wait[{ti['map_index']}] has been running for {now - since:.0f} s without deferring "
                        f"while its batch is still in progress (pid {ti['pid']})"
                    )
            else:
                running_since.pop(ti["map_index"], None)
        return len(tis) == NUM_CHUNKS and all(
            ti["state"] == "deferred" and (ti.get("trigger") or {}).get("triggerer_id") for ti in tis
        )

    return check


def test_kill_mid_merge(deployment: Deployment, undisturbed: Outcome) -> None:
    """Killed while the merge streams a result file: the retry rewrites the same parts."""
    with deployment.faults(delay_routes={CONTENT: HOLD}):
        job = JobRun(deployment, "kill-mid-merge")
        job.wait_held("before", CONTENT, 1)
        job.wait_until(lambda: job.ti("merge")["state"] == "running", "the merge to be the task holding the call")
        job.kill("merge", [-1])
    outcome = job.finish()
    job.assert_retried("merge", [-1])
    assert outcome.delta["batches_created"] == NUM_CHUNKS
    assert outcome.delta["files_uploaded"] == NUM_CHUNKS
    assert_exactly_once(outcome, undisturbed)
