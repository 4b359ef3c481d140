"""A real Airflow deployment for tests: PostgreSQL, api-server, scheduler, dag-processor, triggerer.

Each component runs in its own process group (so it can be killed or restarted alone), on
loopback only, with its output in ``<root>/logs/<component>.log``. The batch emulator runs as a
subprocess next to it, and moto's S3 server (Bedrock job data) in the test process. Nothing here imports Airflow: the components are driven over the REST API
exactly as an operator of the deployment would.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.scheduler.postgres import sqlalchemy_url
from tests.scheduler.processes import (
    Component,
    DeploymentError,
    free_port,
    log_tail,
    parent_pid,
    process_title,
    task_process_pid,
    wait_for,
)
from tests.scheduler.statsd import StatsdListener

EMULATOR_KEY = "emulator-key"
BEDROCK_BUCKET = "abp-scheduler-bedrock"
BEDROCK_INPUT = "input"
COMPONENTS: dict[str, list[str]] = {
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}


# -- the deployment ----------------------------------------------------------------------------------


class Deployment:
    """Airflow on PostgreSQL with every component started separately, plus the batch emulator.

    :param root: scratch folder (AIRFLOW_HOME, logs, data, outputs).
    :param dags_folder: the folder the dag-processor parses.
    :param database: name of an existing, empty PostgreSQL database.
    """

    def __init__(self, root: Path, dags_folder: Path, database: str) -> None:
        self.root = root
        self.home = root / "airflow_home"
        self.logs = root / "logs"
        self.data_dir = root / "data"
        for folder in (self.home, self.logs, self.data_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.dags_folder = dags_folder
        self.database = database
        self.api_port = free_port()
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.bin = Path(sys.executable).parent
        self.components: dict[str, Component] = {}
        self.emulator: Component | None = None
        self.emulator_url = ""
        self.s3_server: Any = None
        self.s3_url = ""
        self._token: str | None = None
        self._http = httpx.Client(timeout=30)
        self.statsd = StatsdListener()
        self.env = self._environment()

    # set-up ----------------------------------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        # Start from a clean slate: the pytest process carries its own AIRFLOW__* settings (unit-test
        # mode, a SQLite DB) that must not leak into a real deployment.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
        for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "BATCH_DEMO_DATA_DIR"):
            env.pop(key, None)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "PYTHONUNBUFFERED": "1",
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "4",
                "AIRFLOW__CORE__FERNET_KEY": _fernet_key(),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy_url(self.database),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__BASE_URL": self.api_url,
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                # Only runs we trigger: unpausing must not also start a scheduled run of the DAG.
                "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                # Speed: a dead task or triggerer is noticed in seconds, not minutes.
                "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC": "3",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
                "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
                "AIRFLOW__LLM_BATCH__WORK_DIR": str(self.root / "jobs"),
                # Metrics as a deployment sends them, to a listener the tests read (self.statsd).
                "AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.statsd.port),
                "AIRFLOW__METRICS__STATSD_PREFIX": self.statsd.prefix,
                "AIRFLOW__METRICS__METRICS_ALLOW_LIST": "llm_batch",
            }
        )
        # Waits defer, as docs/configuration.md advises a deployment: Airflow's own switch, which the sensor follows.
        env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] = "True"
        return env

    def airflow(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run one ``airflow`` CLI command to completion; raise with its output on failure."""
        result = subprocess.run(
            [str(self.bin / "airflow"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise DeploymentError(
                f"airflow {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    def start_emulator(self, *extra: str) -> None:
        """Start the batch emulator on a free port and point the provider connections at it."""
        port_file = self.root / "emulator.port"
        port_file.unlink(missing_ok=True)
        self._start_s3()
        argv = [sys.executable, "-m", "airflow_batch_emulator", "--port", "0", "--port-file", str(port_file),
                "--latency", "0.2", "--s3-endpoint-url", self.s3_url, *extra]  # fmt: skip
        self.emulator = Component("emulator", argv, self.env, self.logs / "emulator.log")
        self.emulator.start()
        port = wait_for(
            lambda: port_file.exists() and port_file.read_text().strip(), 30, "the emulator's port file", 0.1
        )
        self.emulator_url = f"http://127.0.0.1:{int(port)}"
        self.env["AIRFLOW_CONN_OPENAI_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "openai_batch", "host": f"{self.emulator_url}/v1", "password": EMULATOR_KEY}
        )
        self.env["AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT"] = json.dumps(
            {"conn_type": "anthropic_batch", "host": self.emulator_url, "password": EMULATOR_KEY}
        )
        self.env["AIRFLOW_CONN_BEDROCK_BATCH_DEFAULT"] = json.dumps(
            {
                "conn_type": "bedrock_batch",
                "login": "emulator-access-key",
                "password": "emulator-secret-key",
                "extra": {
                    "region_name": "us-east-1",
                    "role_arn": "arn:aws:iam::123456789012:role/bedrock-batch",
                    "input_s3_uri": f"s3://{BEDROCK_BUCKET}/{BEDROCK_INPUT}",
                    "output_s3_uri": f"s3://{BEDROCK_BUCKET}/output",
                    "endpoint_url": self.emulator_url,
                    "s3_endpoint_url": self.s3_url,
                },
            }
        )

    def _start_s3(self) -> None:
        """Start moto's S3 server on a free loopback port, with the Bedrock bucket in it."""
        from moto.server import ThreadedMotoServer

        self.s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.s3_server.start()
        host, port = self.s3_server.get_host_and_port()
        self.s3_url = f"http://{host}:{port}"
        self.s3().create_bucket(Bucket=BEDROCK_BUCKET)

    def s3(self) -> Any:
        """A boto3 S3 client on the deployment's S3 endpoint."""
        import boto3

        creds = {"aws_access_key_id": "x", "aws_secret_access_key": "x"}  # a local endpoint: any key works
        return boto3.client("s3", endpoint_url=self.s3_url, region_name="us-east-1", **creds)

    def bedrock_inputs(self) -> int:
        """Return how many chunk files were uploaded for Bedrock jobs (objects under the input prefix)."""
        pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=BEDROCK_BUCKET, Prefix=BEDROCK_INPUT + "/")
        return sum(len(page.get("Contents", [])) for page in pages)

    def start(self) -> None:
        """Migrate the DB and start every component; return once the API answers and the scheduler beats."""
        self.airflow("db", "migrate")
        api = [str(self.bin / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(self.api_port),
               "--workers", "1"]  # fmt: skip
        self.components["api-server"] = Component("api-server", api, self.env, self.logs / "api-server.log")
        for name, args in COMPONENTS.items():
            self.components[name] = Component(
                name, [str(self.bin / "airflow"), *args], self.env, self.logs / f"{name}.log"
            )
        for component in self.components.values():
            component.start()
        wait_for(self._healthy, 120, "the api-server, scheduler and triggerer to report healthy", 1.0)

    def _healthy(self) -> bool:
        for component in self.components.values():
            if not component.alive:
                raise DeploymentError(f"{component.name} exited early; see {component.log_path}")
        response = self._http.get(f"{self.api_url}/api/v2/monitor/health")
        if response.status_code != 200:
            return False
        health = response.json()
        return all(
            health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler", "triggerer")
        )

    def restart(self, name: str) -> None:
        """Start a stopped component again (same command, same log)."""
        self.components[name].start()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every component and the emulator: SIGTERM all at once, SIGKILL what outlives ``timeout``."""
        every = [*self.components.values(), *([self.emulator] if self.emulator else [])]
        for component in every:
            component.kill(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for component in every:
            component.stop(timeout=max(0.0, deadline - time.monotonic()))
        self._http.close()
        self.statsd.close()
        if self.s3_server is not None:
            self.s3_server.stop()

    def ensure_running(self) -> None:
        """Start again any component that is not running (a test that killed one and then failed)."""
        for component in self.components.values():
            if not component.alive:
                component.start()

    # REST API --------------------------------------------------------------------------------------

    def _password(self) -> str:
        path = self.home / "simple_auth_manager_passwords.json.generated"
        passwords = wait_for(lambda: path.exists() and json.loads(path.read_text()), 30, f"{path}")
        return str(passwords["admin"])

    def _headers(self) -> dict[str, str]:
        if self._token is None:
            response = self._http.post(
                f"{self.api_url}/auth/token", json={"username": "admin", "password": self._password()}
            )
            response.raise_for_status()
            self._token = str(response.json()["access_token"])
        return {"Authorization": f"Bearer {self._token}"}

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call ``/api/v2{path}`` as admin; return the decoded JSON (raise on an error status)."""
        response = self._http.request(method, f"{self.api_url}/api/v2{path}", headers=self._headers(), **kwargs)
        if response.status_code == 401:  # token expired: fetch a new one once
            self._token = None
            response = self._http.request(method, f"{self.api_url}/api/v2{path}", headers=self._headers(), **kwargs)
        if response.status_code >= 400:
            raise DeploymentError(f"{method} /api/v2{path} answered {response.status_code}: {response.text}")
        return response.json() if response.content else None

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Wait until the dag-processor has registered ``dag_id`` and unpause it."""

        def registered() -> bool:
            response = self._http.get(f"{self.api_url}/api/v2/dags/{dag_id}", headers=self._headers())
            return response.status_code == 200

        wait_for(registered, timeout, f"DAG {dag_id} to be parsed by the dag-processor", 1.0)
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, run_id: str, conf: Mapping[str, Any]) -> None:
        """Create a manual DAG run with ``conf``."""
        self.api(
            "POST", f"/dags/{dag_id}/dagRuns", json={"dag_run_id": run_id, "logical_date": None, "conf": dict(conf)}
        )

    def run_state(self, dag_id: str, run_id: str) -> str:
        """Return the DAG run's state."""
        return str(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        """Wait until the run ends; return its final state (``success`` or ``failed``)."""
        return wait_for(
            lambda: (state := self.run_state(dag_id, run_id)) in ("success", "failed") and state,
            timeout,
            f"run {run_id} to end",
            1.0,
        )

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Return every task instance of the run (mapped ones included)."""
        data = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        return list(data["task_instances"])

    def task_instance(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """Return one task instance (``map_index`` for a mapped task)."""
        suffix = f"/{map_index}" if map_index >= 0 else ""
        return dict(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}{suffix}"))

    def tries(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict[str, Any]]:
        """Return the try history of one task instance, oldest first."""
        suffix = f"/{map_index}" if map_index >= 0 else ""
        data = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}{suffix}/tries")
        return sorted(data["task_instances"], key=lambda t: t["try_number"])

    def clear_run(self, dag_id: str, run_id: str, *, from_task: str | None = None) -> None:
        """Clear a finished run (the run's "Clear" in the UI), or ``from_task`` and its downstream; wait until requeued."""
        body: dict[str, Any] = {"dag_run_id": run_id, "dry_run": False, "only_failed": False, "reset_dag_runs": True}
        if from_task is not None:
            body.update(task_ids=[from_task], include_downstream=True)
        self.api("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)
        wait_for(
            lambda: self.run_state(dag_id, run_id) not in ("success", "failed"), 30, f"run {run_id} to be requeued"
        )

    def fail_unfinished_runs(self, dag_id: str, timeout: float = 60) -> list[str]:
        """Mark every queued or running run of ``dag_id`` failed and wait until none of its tasks runs.

        Used after a failed test, so that its run cannot hold the next test's calls or slots.
        """
        runs = self.api("GET", f"/dags/{dag_id}/dagRuns", params={"state": ["queued", "running"], "limit": 100})
        run_ids = [r["dag_run_id"] for r in runs["dag_runs"]]
        for run_id in run_ids:
            self.api("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": "failed"})

        def quiet() -> bool:
            busy = ("running", "queued", "scheduled", "deferred", "up_for_retry", "restarting")
            return not any(ti["state"] in busy for run_id in run_ids for ti in self.task_instances(dag_id, run_id))

        wait_for(quiet, timeout, f"the tasks of {run_ids} to stop", 1.0)
        return run_ids

    # task processes --------------------------------------------------------------------------------

    def kill_task_process(self, ti: Mapping[str, Any]) -> int:
        """SIGKILL the process running ``ti`` (its ``pid``), after checking its title; return the pid.

        The task process is titled ``airflow worker -- <ti id>``; its parent, the supervisor, adds
        ``LocalExecutor:``. Only the task process is killed: the supervisor then reports the try
        failed and the scheduler retries it.
        """
        pid = task_process_pid(ti)
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_supervisor(self, ti: Mapping[str, Any]) -> tuple[int, int]:
        """SIGKILL only the *supervisor* of ``ti``'s task process and leave the task process running.

        Return ``(supervisor pid, task pid)``. The task process (``pid``, titled ``airflow worker --
        <ti id>``) is checked as in :meth:`kill_task_process`; its parent must be titled ``airflow
        worker -- LocalExecutor: <ti id>`` (the LocalExecutor worker that supervises it). With its
        supervisor gone the task process is an orphan: nobody heartbeats for it or reports its end,
        so the scheduler fails the try after ``task_instance_heartbeat_timeout`` and retries it while
        the orphan may still be working. The caller must end the orphan (``os.kill``) when done.
        """
        pid = task_process_pid(ti)
        supervisor = parent_pid(pid)
        supervisor_title = process_title(supervisor)
        if f"LocalExecutor: {ti['id']}" not in supervisor_title:
            raise DeploymentError(f"pid {supervisor}, parent of {pid}, is not the supervisor of {ti['id']}: "
                                  f"{supervisor_title!r}")  # fmt: skip
        os.kill(supervisor, signal.SIGKILL)
        return supervisor, pid

    # emulator --------------------------------------------------------------------------------------

    def emulator_get(self, path: str) -> Any:
        """GET an emulator control route and return its JSON."""
        response = self._http.get(f"{self.emulator_url}{path}")
        response.raise_for_status()
        return response.json()

    def set_faults(self, **faults: Any) -> None:
        """Replace the emulator's fault settings (unnamed ones go back to off)."""
        self._http.post(f"{self.emulator_url}/_emulator/faults", json=faults).raise_for_status()

    def held_calls(self) -> list[dict[str, Any]]:
        """Return the calls a route delay holds now (``id``, ``phase``, ``request``, ``client`` ``host:port``, ``held_s``)."""
        return list(self.emulator_get("/_emulator/stats")["http"]["delayed_calls"])

    def release_held(self, ids: list[int] | None = None) -> list[int]:
        """End the hold of the held calls ``ids`` (all when None) now; return the ids the emulator released."""
        body = {} if ids is None else {"ids": ids}
        response = self._http.post(f"{self.emulator_url}/_emulator/release", json=body)
        response.raise_for_status()
        return list(response.json()["released"])

    @contextmanager
    def faults(self, **faults: Any) -> Iterator[None]:
        """Switch emulator faults on for a block, and off again however the block ends."""
        self.set_faults(**faults)
        try:
            yield
        finally:
            self.set_faults()

    # diagnostics -----------------------------------------------------------------------------------

    def diagnostics(self, lines: int = 120) -> str:
        """Return the tail of every component log and of every task log: the clues when CI fails."""
        parts: list[str] = []
        for component in [*self.components.values(), *([self.emulator] if self.emulator else [])]:
            parts.append(
                log_tail(component.log_path, lines, f"{component.name} ({'alive' if component.alive else 'stopped'})")
            )
        task_logs = sorted((self.home / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
        for path in task_logs[-25:]:
            parts.append(log_tail(path, 60, str(path.relative_to(self.home / "logs"))))
        return "\n".join(parts)


def _fernet_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()
