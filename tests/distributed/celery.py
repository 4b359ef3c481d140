"""A CeleryExecutor deployment whose workers share no disk: S3 (moto) for data, Redis, PostgreSQL.

Extends the scheduler suite's :class:`~tests.scheduler.deployment.Deployment` (api-server,
scheduler, dag-processor, triggerer on PostgreSQL, each its own process) with CeleryExecutor,
Redis as broker (every key under a unique prefix, deleted at the end), the PostgreSQL database
as result backend, and Celery workers as separate processes. Each worker has its own private
HOME, TMPDIR, log folder and ``AIRFLOW__LLM_BATCH__WORK_DIR`` and its own host name, so a file that
one task left on "its" disk is invisible to a task on another worker: everything the stages
hand over goes through S3.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT
from tests.distributed.s3 import MotoS3
from tests.scheduler.deployment import Deployment
from tests.scheduler.postgres import sqlalchemy_url
from tests.scheduler.processes import Component, wait_for

REDIS_URL = os.environ.get("ABP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# name -> (queues, concurrency): two general workers and one GPU worker, as in the README recipe.
WORKERS: dict[str, tuple[str, int]] = {
    "worker-a": ("default", 2),
    "worker-b": ("default", 2),
    "worker-gpu": ("gpu", 1),
}


class CeleryDeployment(Deployment):
    """Airflow with CeleryExecutor, three workers on private disks, and S3 for every data path."""

    def __init__(self, root: Path, dags_folder: Path, database: str, s3: MotoS3) -> None:
        self.object_store = s3  # the S3 of the job folders; Deployment.s3() is the Bedrock bucket's client
        self.key_prefix = f"abp-{uuid.uuid4().hex[:10]}:"
        self.workers: dict[str, Component] = {}
        super().__init__(root, dags_folder, database)

    def _environment(self) -> dict[str, str]:
        env = super()._environment()
        env.update(self.object_store.connection_env())
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CORE__PARALLELISM": "8",
                "AIRFLOW__CELERY__BROKER_URL": REDIS_URL,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + sqlalchemy_url(self.database),
                # Redis is shared: every key of this deployment (queues included) under its own prefix.
                "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__GLOBAL_KEYPREFIX": self.key_prefix,
                "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
                "AIRFLOW__OPERATORS__DEFAULT_QUEUE": "default",
                # A worker that dies is noticed within half a minute (its tasks then retry elsewhere).
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                "PYTHONPATH": str(REPO_ROOT),  # the workers' hostname_callable lives in tests/
            }
        )
        # No component shares a work dir with the workers: data paths are s3:// in every run.
        env.pop("AIRFLOW__LLM_BATCH__WORK_DIR", None)
        return env

    def start(self) -> None:
        """Start the core components, then the workers; return once every worker answers Celery pings."""
        super().start()
        for name, (queues, concurrency) in WORKERS.items():
            self.workers[name] = self._worker(name, queues, concurrency)
            self.workers[name].start()
        wait_for(self._workers_ready, 180, f"Celery workers {sorted(WORKERS)} to come online", 2.0)

    def _worker(self, name: str, queues: str, concurrency: int) -> Component:
        private = self.root / name
        for sub in ("home", "tmp", "work", "logs"):
            (private / sub).mkdir(parents=True, exist_ok=True)
        env = {
            **self.env,
            "HOME": str(private / "home"),
            "TMPDIR": str(private / "tmp"),
            "AIRFLOW__LLM_BATCH__WORK_DIR": str(private / "work"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(private / "logs"),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "tests.distributed.worker_host.hostname",
            "ABP_WORKER_HOSTNAME": name,
        }
        if queues == "gpu":  # vLLM cannot run here (no GPU): this worker selects the stand-in engine
            env["AIRFLOW__LLM_BATCH__VLLM_ENGINE_FACTORY"] = "tests.distributed.stand_in_vllm.create_engine"
        argv = [str(self.bin / "airflow"), "celery", "worker", "--queues", queues, "--concurrency", str(concurrency),
                "--celery-hostname", f"{name}@127.0.0.1", "--skip-serve-logs"]  # fmt: skip
        return Component(name, argv, env, self.logs / f"{name}.log")

    def _workers_ready(self) -> bool:
        for worker in self.workers.values():
            if not worker.alive:
                raise AssertionError(f"{worker.name} exited early; see {worker.log_path}")
        return all("ready." in worker.log_path.read_text(errors="replace") for worker in self.workers.values())

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the workers first (they would retry the broker), then everything else; drop the Redis keys."""
        for worker in self.workers.values():
            worker.stop(timeout=timeout)
        super().stop(timeout)
        self._drop_redis_keys()

    def _drop_redis_keys(self) -> None:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=f"{self.key_prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

    def ensure_running(self) -> None:
        """Start again any component or worker that is not running; wait until the workers are ready."""
        super().ensure_running()
        for worker in self.workers.values():
            if not worker.alive:
                worker.log_path.write_text("")  # readiness is read from the log
                worker.start()
        wait_for(self._workers_ready, 180, "the restarted Celery workers to come online", 2.0)

    # what ran where ----------------------------------------------------------------------------------

    def placement(self, dag_id: str, run_id: str) -> dict[str, Counter[str]]:
        """Return ``{task_id: Counter(hostname)}`` for the run's task instances that ran."""
        where: dict[str, Counter[str]] = {}
        for ti in self.task_instances(dag_id, run_id):
            if ti.get("hostname"):
                where.setdefault(ti["task_id"], Counter())[ti["hostname"]] += 1
        return where

    def per_worker(self, dag_id: str, run_id: str) -> dict[tuple[str, str], int]:
        """Return ``{(hostname, queue): task instances}`` for the run: what each worker ran per queue."""
        counts: Counter[tuple[str, str]] = Counter()
        for ti in self.task_instances(dag_id, run_id):
            if ti.get("hostname"):
                counts[(ti["hostname"], ti.get("queue") or "")] += 1
        return dict(counts)

    def diagnostics(self, lines: int = 120) -> str:
        """The core components' and the emulator's logs, then each worker's log and latest task logs."""
        parts = [super().diagnostics(lines)]
        from tests.scheduler.processes import log_tail

        for worker in self.workers.values():
            parts.append(log_tail(worker.log_path, lines, f"{worker.name} ({'alive' if worker.alive else 'stopped'})"))
            task_logs = sorted((self.root / worker.name / "logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
            for path in task_logs[-8:]:
                parts.append(log_tail(path, 60, f"{worker.name}: {path.name}"))
        return "\n".join(parts)


def task_summary(tis: list[dict[str, Any]]) -> str:
    """One line per task instance (task[map] state host queue try): for assertion messages."""
    return "\n".join(
        f"{ti['task_id']}[{ti['map_index']}] {ti['state']} {ti.get('hostname')} {ti.get('queue')} try {ti['try_number']}"
        for ti in sorted(tis, key=lambda t: (t["task_id"], t["map_index"]))
    )
