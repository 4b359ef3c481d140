"""Retention of job folders: request bodies go once a run merged; ``jobs gc`` removes old job folders only."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.job_folder import JobFolder
from airflow_batch_provider.jobs.__main__ import main as jobs_main
from airflow_batch_provider.jobs.retention import release_after_merge
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from tests.conftest import REPO_ROOT
from tests.support import InMemoryTaskStateStore, make_context, write_chunk
from tests.test_dags import airflow_db  # noqa: F401  (the session fixture that migrates the test DB)


def _wait_outputs(dag_id: str, run_id: str) -> list[dict]:
    """Return the mapped ``wait`` task's XCom: what a cleared merge task receives again."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(XComModel)
            .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == "wait")
            .where(XComModel.key == "return_value")
            .order_by(XComModel.map_index)
        ).all()
        return [XComModel.deserialize_value(row) for row in rows]


@pytest.mark.scenario
def test_a_merged_run_keeps_no_request_bodies_and_its_merge_can_run_again(
    airflow_db,  # noqa: F811
    openai_conn,
    tmp_path,
    monkeypatch,
):
    """The example DAG at 3,000 rows (demo-sized): after the merge only what a clear or an audit needs is left."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_batch_provider.operators.merge import MergeResultsOperator

    jobs = tmp_path / "jobs"
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(jobs))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    out = tmp_path / "out"
    conf = {"rows": 3000, "data_dir": str(tmp_path / "data"), "output_dir": str(out), "poll_interval": 0.2}
    run = dag.test(run_conf=conf)
    assert run.state == "success"

    files = [p for p in jobs.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.endswith(".jsonl")], files  # no request bodies left behind
    (merged_record,) = [p for p in files if p.name == "merged.json"]
    record = orjson.loads(merged_record.read_bytes())
    assert record["removed_files"] == 1 and record["removed_bytes"] > 3000 * 300 and record["output_dir"] == str(out)
    names = {p.name for p in files}
    assert {"manifest.json", "schema.json", "chunk-00000.rows.parquet"} <= names  # what a clear and an audit need

    # A clear of the merge re-runs it on the same input: the answers come from the provider again,
    # the rows from the kept rows files; the output is the same.
    batches = _wait_outputs(dag.dag_id, run.run_id)
    again = tmp_path / "again"
    summary = MergeResultsOperator(task_id="merge", batches=batches, output_dir=str(again)).execute({})
    assert summary["rows"] == 3000 and summary["succeeded"] == 3000
    assert pq.read_table(again).to_pylist() == pq.read_table(out).to_pylist()


def _chunk_in_job_folder(job_dir: Path, rows: list[dict]) -> dict:
    """A chunk written where the chunk step puts it: ``job_dir/chunks/chunk-00000.jsonl``."""
    chunk = write_chunk(Path(str(JobFolder(job_dir).chunks.folder)), rows)
    assert chunk["requests_path"] == str(JobFolder(job_dir).chunks.requests(0))
    return {**chunk, "job_dir": str(job_dir)}


def test_a_submit_without_its_request_file_says_to_clear_the_chunk_task(openai_conn, tmp_path):
    """A new batch needs the request body; once retention removed it, the error says what to do."""
    chunk = _chunk_in_job_folder(tmp_path / "job", [{"custom_id": f"s{i}", "text": f"t{i}"} for i in range(3)])
    release_after_merge([chunk], str(tmp_path / "out"))
    assert not Path(chunk["requests_path"]).exists()
    with pytest.raises(InvalidInputError, match="Clear the chunk task"):
        SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(InMemoryTaskStateStore()))
    assert openai_conn.stats()["openai"]["files_uploaded"] == 0


def test_retention_leaves_a_request_file_it_did_not_send(tmp_path):
    """A later run that reused the job folder has rebuilt chunks/: its different file stays."""
    chunk = _chunk_in_job_folder(tmp_path / "job", [{"custom_id": "a", "text": "t"}])
    outside = write_chunk(tmp_path / "elsewhere", [{"custom_id": "b", "text": "t"}])  # not under its job_dir's chunks/
    release_after_merge([outside], str(tmp_path / "out"))
    assert Path(outside["requests_path"]).exists()
    Path(chunk["requests_path"]).write_bytes(b"{}\n")  # not the bytes this run's descriptor describes
    (released,) = release_after_merge([chunk], str(tmp_path / "out"))
    assert released.files == [] and Path(chunk["requests_path"]).exists()
    assert JobFolder(chunk["job_dir"]).merged_record.exists()


def _job(root: Path, name: str, *, merged_days_ago: float | None, changed_days_ago: float) -> Path:
    job = JobFolder(root / "dag" / name / "chunk")
    job.chunks.folder.mkdir(parents=True)
    job.chunks.manifest.write_bytes(b"[]")
    job.chunks.rows(0).write_bytes(b"x" * 1000)
    if merged_days_ago is not None:
        when = datetime.now(UTC) - timedelta(days=merged_days_ago)
        job.merged_record.write_bytes(orjson.dumps({"merged_at": when.isoformat()}))
    stamp = time.time() - changed_days_ago * 86400
    for path in [*job.path.rglob("*"), job.path]:
        os.utime(path, (stamp, stamp))
    return job.path


def test_gc_removes_old_merged_jobs_and_never_a_running_one(tmp_path, capsys):
    root = tmp_path / "jobs"
    old = _job(root, "old_merged", merged_days_ago=9, changed_days_ago=9)
    recent = _job(root, "recent_merged", merged_days_ago=1, changed_days_ago=1)
    running = _job(root, "running", merged_days_ago=None, changed_days_ago=0.01)
    abandoned = _job(root, "abandoned", merged_days_ago=None, changed_days_ago=30)

    assert jobs_main(["gc", "--root", str(root), "--older-than", "7d", "--dry-run"]) == 0
    assert old.exists()  # a dry run removes nothing
    assert jobs_main(["gc", "--root", str(root), "--older-than", "7d"]) == 0
    assert not old.exists() and not old.parent.exists()  # the empty run_id folder went with it
    assert recent.exists() and running.exists() and abandoned.exists()
    printed = capsys.readouterr().out
    assert "treated as running" in printed and "no --include-unmerged" in printed

    assert jobs_main(["gc", "--root", str(root), "--older-than", "7d", "--include-unmerged"]) == 0
    assert not abandoned.exists()
    assert running.exists() and recent.exists()  # changed 15 minutes ago: never removed

    assert jobs_main(["gc", "--root", str(root), "--older-than", "soon"]) == 2
    assert "7d, 12h" in capsys.readouterr().err
