"""A Celery worker dies (SIGKILL: the machine is gone) or is stopped warm (SIGTERM) during a task.

Each test holds one emulator call with a route delay so the task is known to be mid-way, finds
the worker that runs it from the task instance's ``hostname``, and signals that worker's whole
process group (the Celery main process, its pool and the task processes). Airflow notices the
lost heartbeat, fails the try and retries it; the only other ``default`` worker takes the retry.
The run must end as an undisturbed one: one batch per chunk, every row once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_batch_emulator.examples import synthetic_products
from airflow_batch_provider.utils import storage
from tests.distributed.celery import CeleryDeployment, task_summary
from tests.distributed.s3 import MotoS3
from tests.scheduler.deployment import EMULATOR_KEY
from tests.scheduler.processes import wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

DAG_ID = "nightly_product_classification"
ROWS = 1_200
CHUNK_SIZE = 600  # two chunks
HOLD = 40  # seconds a held call waits; the kill lands long before
CREATE = "POST /v1/batches"


def _trigger(deployment: CeleryDeployment, s3: MotoS3, run_id: str) -> str:
    output = s3.url("output", run_id)
    conf = {
        "rows": ROWS,
        "chunk_size": CHUNK_SIZE,
        "data_dir": s3.url("data", "crash"),
        "job_dir": s3.url("jobs"),
        "output_dir": output,
        "poll_interval": 1,
    }
    deployment.trigger(DAG_ID, run_id, conf)
    return output


def _held(deployment: CeleryDeployment, phase: str, prefix: str) -> int:
    calls = deployment.emulator_get("/_emulator/stats")["http"]["delayed_in_flight"]
    return sum(c["count"] for c in calls if c["phase"] == phase and c["request"].startswith(prefix))


def _running_host(deployment: CeleryDeployment, run_id: str, task_id: str, map_index: int = -1) -> str:
    ti = deployment.task_instance(DAG_ID, run_id, task_id, map_index)
    return str(ti["hostname"]) if ti["state"] == "running" and ti.get("hostname") else ""


def _run_batches(deployment: CeleryDeployment, run_id: str) -> list[dict[str, Any]]:
    listing = deployment.emulator_get("/_emulator/batches?custom_ids=1")["data"]
    return [b for b in listing if (b.get("metadata") or {}).get("airflow_run_id") == run_id]


def _assert_exact(deployment: CeleryDeployment, run_id: str, output: str) -> None:
    batches = _run_batches(deployment, run_id)
    summary = [(b["id"], b["status"], b["metadata"].get("airflow_task")) for b in batches]
    assert sorted(b["metadata"]["airflow_task"] for b in batches) == ["submit[0]", "submit[1]"], summary
    assert all(b["status"] == "completed" for b in batches), summary
    sent = [cid for b in batches for cid in b["custom_ids"]]
    source = set(synthetic_products(ROWS).column("product_id").to_pylist())
    assert len(sent) == ROWS and set(sent) == source
    folder = storage.to_path(output)
    names = sorted(p.name for p in folder.iterdir())
    parts = [name for name in names if name.startswith("part-")]
    assert parts == ["part-00000.parquet", "part-00001.parquet"] and "_SUMMARY.json" in names, names
    assert not [name for name in names if name.endswith(".tmp")], names
    ids: list[str] = []
    for name in parts:
        with (folder / name).open("rb") as handle:
            ids += pq.read_table(handle, columns=["custom_id"]).column("custom_id").to_pylist()
    assert len(ids) == ROWS and set(ids) == source


def _assert_moved(deployment: CeleryDeployment, run_id: str, task_id: str, map_index: int, victim: str) -> None:
    tries = deployment.tries(DAG_ID, run_id, task_id, map_index)
    seen = [(t["state"], t.get("hostname")) for t in tries]
    assert len(tries) >= 2 and seen[0] == ("failed", victim), seen
    assert seen[-1][0] == "success" and seen[-1][1] not in (victim, "worker-gpu"), seen


@pytest.fixture(autouse=True)
def _isolated(celery_deployment: CeleryDeployment, s3: MotoS3) -> Iterator[None]:
    """No fault, unfinished run or dead worker is left for the next test."""
    yield
    celery_deployment.set_faults()
    celery_deployment.ensure_running()
    celery_deployment.fail_unfinished_runs(DAG_ID)


def test_worker_killed_during_submit(celery_deployment: CeleryDeployment, s3: MotoS3) -> None:
    """SIGKILL the worker while its submit's ``POST /v1/batches`` ran but the answer is held: the batch
    exists, its id never reached the task. The retry, on the other worker, reattaches to it."""
    deployment = celery_deployment
    run_id = "kill-submit"
    with deployment.faults(delay_after_routes={CREATE: HOLD}):
        output = _trigger(deployment, s3, run_id)
        wait_for(lambda: _held(deployment, "after", CREATE) >= 1, 240, "a batch create to be held")
        victim = wait_for(lambda: _running_host(deployment, run_id, "submit", 0), 60, "submit[0] to run")
        deployment.workers[victim].kill(signal.SIGKILL)
    state = deployment.wait_for_run(DAG_ID, run_id, timeout=400)
    tis = deployment.task_instances(DAG_ID, run_id)
    assert state == "success", task_summary(tis)
    _assert_moved(deployment, run_id, "submit", 0, victim)
    _assert_exact(deployment, run_id, output)


def test_worker_killed_while_merge_writes_parts(celery_deployment: CeleryDeployment, s3: MotoS3) -> None:
    """SIGKILL the merge's worker after it wrote chunk 0's part to S3 and while it downloads chunk 1's
    results: the retry on the other worker rewrites the parts; no row is lost or doubled."""
    deployment = celery_deployment
    run_id = "kill-merge"
    output = _trigger(deployment, s3, run_id)

    def second_output_file() -> str:
        batches = {b["metadata"]["airflow_task"]: b for b in _run_batches(deployment, run_id)}
        batch = batches.get("submit[1]")
        if not batch or batch["status"] != "completed":
            return ""
        response = deployment._http.get(
            f"{deployment.emulator_url}/v1/batches/{batch['id']}", headers={"Authorization": f"Bearer {EMULATOR_KEY}"}
        )
        return str(response.json().get("output_file_id") or "")

    # Hold chunk 1's result download as soon as its batch has an output file (before the merge starts).
    file_id = wait_for(second_output_file, 240, "chunk 1's batch to finish", 0.3)
    with deployment.faults(delay_routes={f"GET /v1/files/{file_id}/content": HOLD}):
        wait_for(lambda: _held(deployment, "before", f"GET /v1/files/{file_id}") >= 1, 240, "the merge to download")
        victim = wait_for(lambda: _running_host(deployment, run_id, "merge"), 60, "merge to run")
        wait_for(lambda: s3.keys(f"output/{run_id}/part-00000"), 60, "chunk 0's part on S3")
        deployment.workers[victim].kill(signal.SIGKILL)
    state = deployment.wait_for_run(DAG_ID, run_id, timeout=400)
    tis = deployment.task_instances(DAG_ID, run_id)
    assert state == "success", task_summary(tis)
    _assert_moved(deployment, run_id, "merge", -1, victim)
    _assert_exact(deployment, run_id, output)


def test_warm_shutdown_lets_the_running_task_finish(celery_deployment: CeleryDeployment, s3: MotoS3) -> None:
    """SIGTERM to the worker's main process only (what ``docker compose stop`` sends with
    ``DUMB_INIT_SETSID=0``): Celery's warm shutdown takes no new task, lets the running submit finish
    on this worker (one try, success), then exits; the rest of the run goes to the other worker."""
    deployment = celery_deployment
    run_id = "warm-shutdown"
    with deployment.faults(delay_after_routes={CREATE: 10}):
        output = _trigger(deployment, s3, run_id)
        wait_for(lambda: _held(deployment, "after", CREATE) >= 1, 240, "a batch create to be held")
        victim = wait_for(lambda: _running_host(deployment, run_id, "submit", 0), 60, "submit[0] to run")
        worker = deployment.workers[victim]
        assert worker.process is not None
        worker.process.send_signal(signal.SIGTERM)
        worker.process.wait(timeout=120)  # exits once its running tasks are done
    state = deployment.wait_for_run(DAG_ID, run_id, timeout=400)
    tis = deployment.task_instances(DAG_ID, run_id)
    assert state == "success", task_summary(tis)
    tries = deployment.tries(DAG_ID, run_id, "submit", 0)
    assert [(t["state"], t.get("hostname")) for t in tries] == [("success", victim)]
    later = [ti for ti in tis if ti["task_id"] in ("wait", "merge")]
    assert all(ti["hostname"] != victim for ti in later), task_summary(tis)
    _assert_exact(deployment, run_id, output)
