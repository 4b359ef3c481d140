"""Watch the example DAG run on a CeleryExecutor deployment with S3 storage (what ``make demo-distributed`` calls).

Starts, on 127.0.0.1 only: moto's S3 server, the batch emulator, and Airflow on PostgreSQL
(a throwaway database) with Redis as Celery broker (keys under a unique prefix) — api-server,
scheduler, dag-processor, triggerer and three Celery workers, two on queue ``default`` and one
on ``gpu``, each with a private HOME, TMPDIR and work dir. Source table, job folder and output
are on ``s3://``. It runs the example DAG, prints which worker ran how many task instances per
queue, stops everything and drops the database and Redis keys. Needs PostgreSQL on
127.0.0.1:5432 (user postgres, trust) and Redis on 127.0.0.1:6379, as the test suite does.
The last line printed is ``output: s3://…``.

This is the same deployment the ``distributed`` test suite uses (``tests/distributed/``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.distributed.celery import CeleryDeployment, task_summary  # noqa: E402
from tests.distributed.s3 import MotoS3  # noqa: E402
from tests.scheduler.postgres import create_database, drop_database  # noqa: E402

DAG_ID = "nightly_product_classification"


def main() -> int:
    """Start the deployment, run the DAG once, report, tear everything down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--chunk-size", type=int, default=250)
    parser.add_argument("--backend", choices=["openai", "anthropic"], default="openai")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="abp-distributed-"))
    s3 = MotoS3(root)
    database = create_database("abp_demo")
    deployment: CeleryDeployment | None = None
    try:
        print(f"starting moto S3, the emulator and Airflow with three Celery workers (logs: {root}/logs)", flush=True)
        s3.start()
        deployment = CeleryDeployment(root, REPO / "dags", database, s3)
        deployment.start_emulator()
        deployment.start()
        deployment.wait_for_dag(DAG_ID)
        run_id = f"demo-{int(time.time())}"
        output = s3.url("output", run_id)
        conf = {
            "rows": args.rows,
            "chunk_size": args.chunk_size,
            "provider": args.backend,
            "data_dir": s3.url("data"),
            "job_dir": s3.url("jobs"),
            "output_dir": output,
            "poll_interval": 1,
        }
        print(f"triggered {DAG_ID} run {run_id}: {args.rows:,} rows, chunk_size {args.chunk_size}", flush=True)
        deployment.trigger(DAG_ID, run_id, conf)
        state = deployment.wait_for_run(DAG_ID, run_id, timeout=900)
        tis = deployment.task_instances(DAG_ID, run_id)
        if state != "success":
            print(f"run {run_id} ended {state}:\n{task_summary(tis)}\n\n{deployment.diagnostics(40)}")
            return 1
        print("task instances per worker and queue:")
        for (host, queue), count in sorted(deployment.per_worker(DAG_ID, run_id).items()):
            print(f"  {host:<12} queue {queue:<8} {count:>3}")
        parts = [key for key in s3.keys(f"output/{run_id}/") if key.rsplit("/", 1)[1].startswith("part-")]
        print(f"{len(parts)} part files on S3 (bucket {s3.bucket} at {s3.endpoint_url})")
        print(f"output: s3://{s3.bucket}/output/{run_id}")
        return 0
    finally:
        if deployment is not None:
            deployment.stop()
        s3.stop()
        drop_database(database)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
