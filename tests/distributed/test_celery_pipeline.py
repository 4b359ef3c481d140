"""The example DAGs on CeleryExecutor workers that share no disk, with every data path on S3.

Source table, job folder and output dataset are ``s3://`` URLs on moto's server; the workers
each have a private HOME, TMPDIR and ``AIRFLOW__LLM_BATCH__WORK_DIR`` (see ``celery.py``), so a chunk
file written by the chunk task reaches the submit task on another worker only through S3.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.utils import storage
from tests.distributed.celery import CeleryDeployment, task_summary
from tests.distributed.s3 import MotoS3

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

DAG_ID = "nightly_product_classification"
ROWS = 1_200
CHUNK_SIZE = 150  # 8 chunks: 8 mapped submit and 8 wait tasks for two default workers


def _conf(s3: MotoS3, name: str, **extra: object) -> dict[str, object]:
    return {
        "rows": ROWS,
        "chunk_size": CHUNK_SIZE,
        "data_dir": s3.url("data", name),
        "job_dir": s3.url("jobs"),
        "output_dir": s3.url("output", name),
        "poll_interval": 1,
        **extra,
    }


def _output_ids(output_dir: str) -> list[str]:
    ids: list[str] = []
    for part in storage.to_path(output_dir).iterdir():
        if part.name.startswith("part-"):
            with part.open("rb") as handle:
                ids += pq.read_table(handle, columns=["custom_id"]).column("custom_id").to_pylist()
    return ids


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_example_dag_on_celery_and_s3(celery_deployment: CeleryDeployment, s3: MotoS3, provider: str) -> None:
    deployment = celery_deployment
    run_id = f"s3-{provider}"
    conf = _conf(s3, provider, provider=provider)
    deployment.trigger(DAG_ID, run_id, conf)
    state = deployment.wait_for_run(DAG_ID, run_id, timeout=600)
    tis = deployment.task_instances(DAG_ID, run_id)
    assert state == "success", task_summary(tis)

    where = deployment.placement(DAG_ID, run_id)
    mapped_hosts = where["submit"] + where["wait"]
    assert set(mapped_hosts) == {"worker-a", "worker-b"}, f"mapped tasks did not spread:\n{task_summary(tis)}"
    assert all(ti["queue"] == "default" for ti in tis), task_summary(tis)

    ids = _output_ids(str(conf["output_dir"]))
    assert len(ids) == ROWS and len(set(ids)) == ROWS
    # Nothing went through a worker's own disk: the job folder is on S3 and the work dirs hold no chunk.
    assert s3.keys(f"jobs/{DAG_ID}/{run_id}/chunk/chunks/manifest.json")
    for name in ("worker-a", "worker-b", "worker-gpu"):
        assert not list((deployment.root / name / "work").rglob("*.jsonl")), name


def test_self_hosted_vllm_generates_only_on_the_gpu_worker(celery_deployment: CeleryDeployment, s3: MotoS3) -> None:
    """vllm mode: every generate task ran on the ``gpu`` worker; chunk and merge on default workers.

    vLLM cannot run here (no GPU): the gpu worker selects a stand-in engine through the documented
    ``AIRFLOW__LLM_BATCH__VLLM_ENGINE_FACTORY`` setting (``stand_in_vllm.py``); the other workers have no
    engine at all, so a generate task that landed there would fail.
    """
    deployment = celery_deployment
    dag_id, run_id = "self_hosted_vllm", "s3-vllm"
    conf = _conf(s3, "vllm", mode="vllm", chunk_size=400)  # 3 generate tasks
    conf.pop("poll_interval")
    deployment.trigger(dag_id, run_id, conf)
    state = deployment.wait_for_run(dag_id, run_id, timeout=600)
    tis = deployment.task_instances(dag_id, run_id)
    assert state == "success", task_summary(tis)

    where = deployment.placement(dag_id, run_id)
    assert where["vllm_generate"] == {"worker-gpu": 3}, task_summary(tis)
    assert {ti["queue"] for ti in tis if ti["task_id"] == "vllm_generate"} == {"gpu"}
    for task_id in ("chunk", "merge"):
        assert set(where[task_id]) <= {"worker-a", "worker-b"}, task_summary(tis)
    assert "server_generate" not in where  # the branch not taken is skipped

    ids = _output_ids(str(conf["output_dir"]))
    assert len(ids) == ROWS and len(set(ids)) == ROWS
    generate = [ti for ti in tis if ti["task_id"] == "vllm_generate"]
    versions = set()
    for ti in generate:
        xcom = deployment.api(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/vllm_generate/xcomEntries/return_value",
            params={"map_index": ti["map_index"]},
        )  # fmt: skip
        versions.add(xcom["value"]["generation"]["vllm_version"])
    assert len(versions) == 1 and versions.pop().endswith("(stand-in)")
