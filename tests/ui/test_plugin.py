"""The plugin is registered by installing the package: ``airflow plugins`` lists it with its app and views."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from airflow_batch_provider.ui.model import TaskRecord, build_run_view


def test_airflow_plugins_lists_the_llm_batches_plugin(tmp_path):
    env = {"AIRFLOW_HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "plugins", "--output", "json"],
        env=env, capture_output=True, text=True, timeout=180, check=True,
    )  # fmt: skip
    plugins = {p["name"]: p for p in json.loads(out.stdout[out.stdout.index("[") :])}
    plugin = plugins["llm_batches"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/llm-batches"
    views = {v["destination"]: v for v in plugin["external_views"]}
    assert set(views) == {"nav", "dag_run", "task_instance"}
    assert views["nav"]["name"] == "LLM batches"
    assert "{DAG_ID}" in views["dag_run"]["href"] and "{MAP_INDEX}" in views["task_instance"]["href"]


def test_a_chunk_not_yet_polled_shows_its_batch_and_a_follow_up_shows_in_attempts():
    """Rows come from the chunk list first, then the submit result, then the sensor's progress and checkpoint."""
    chunks = [{"job_dir": "/j", "chunk_index": i, "label": f"chunk {i + 1}/2", "num_requests": 10} for i in range(2)]
    progress = {**chunks[1], "batch_id": "b2", "provider_status": "in_progress", "completed": 4, "failed": 1,
                "total": 10, "console_url": "https://console/b2"}  # fmt: skip
    view = build_run_view(
        "d",
        "r",
        "running",
        [
            TaskRecord("chunk", -1, "ChunkOperator", "success", None, None, 1, result=chunks),
            TaskRecord("submit", 0, "SubmitBatchOperator", "success", None, None, 1, result={**chunks[0], "batch_id": "b1"}),
            TaskRecord("submit", 1, "SubmitBatchOperator", "success", None, None, 1, result={**chunks[1], "batch_id": "b2"}),
            TaskRecord("wait", 1, "BatchCompleteSensor", "deferred", None, None, 1, progress=progress,
                       checkpoint={"attempts": [{"batch_id": "b2"}, {"batch_id": "b2-retry"}]}),
        ],
    )  # fmt: skip
    first, second = view.chunks
    assert (first.batch_id, first.done, first.waiting, first.total, first.console_url) == ("b1", 0, 10, 10, "")
    # b2 answered 4 and failed 1 of 10 at its last poll; the checkpoint says a follow-up went out:
    # with no failure record yet, its 6 unfinished lines count as being retried, none as final.
    assert (second.succeeded, second.failed, second.retrying, second.total) == (4, 0, 6, 10)
    assert second.console_url == "https://console/b2"
    assert second.followups == ["b2-retry"] and second.phase == "wait: deferred"
    assert view.requests == 20 and view.completed == 4 and view.live
