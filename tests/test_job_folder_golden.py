"""The example DAG writes the same job folder and merged output, byte for byte, as the recorded run.

``fixtures/example_dag_files.json`` holds the sha256 of every file under the chunk task's job
folder and under the merge's output folder after two runs of ``nightly_product_classification``
per provider: 1,200 rows, then 1,500 rows into the same output, so ``skip_unchanged`` carries the
first 1,200 rows (a carry file and a filtered request file of 300 new rows), then the same 1,500
rows again (every row carried: an empty request file, no batch). The digests were
first recorded with the code of 4f780af (main before the job folder had one owner) and
re-recorded at the merge of the hardening branch (issue 13) for its intended changes only: the
output parts and carry files gained the ``error_code`` column (all null here: every row
succeeds), the Anthropic run's default model became
the priced ``claude-haiku-4-5`` (so its request lines, fingerprints, answers and cost figures
changed), and ``chunks/manifest.json`` is now the final descriptor list (written last); and again
for prompt caching (issue 40): ``_SUMMARY.json`` gained the cache keys (``cached_input_tokens``,
``cache_write_tokens``, ``uncached_cost_usd``, ``cache_saved_usd``) and the emulator counts Claude
input tokens as the estimate does, which changed the Anthropic parts' and carry files'
``input_tokens`` (request files, descriptors and manifests are unchanged: the example's system
prompt is too short to cache); and for the carried rerun's ``_SUMMARY.json``, whose cost comparison
now reads ``$0`` for nothing billed instead of ``$0.000000``. Job
folder names (run_id plus a hash) do not show: paths are normalised. Regenerate them only for an
intended format change: ``ABP_RECORD_GOLDEN=1 pytest tests/test_job_folder_golden.py``.

What is compared, and why it is deterministic:

- the listing of both folders (relative paths, sorted) and each file's sha256;
- the absolute job and output folder paths (they contain the run id, a timestamp) are replaced
  by ``$JOB_DIR`` / ``$OUTPUT_DIR`` in the bytes before hashing: they appear in manifest.json
  and _SUMMARY.json only; two files with clock times are not compared: ``_REPORT.html``, the run
  report, which draws the provider's batch timestamps (tests/report checks its content), and
  ``merged.json`` (retention); the request files retention removed are compared by the manifest's
  sha256 of them;
- batch ids (in the parts and carry files): each test starts its own emulator, whose ids come
  from a counter, and holds every batch until its status is read once (``polls_before_done=1``),
  so ids are taken in task order, not in the order its worker happens to finish batches. The
  example DAG's chunk_size (10,000) gives one chunk per run: with several, ``dag.test()`` runs the
  mapped submit tasks in no fixed order and the batch ids would swap between chunks;
- ``chunks/manifest.json`` must also equal the descriptors the chunk task returned (recorded
  too, as normalised JSON), less the cost estimate that the operator adds after the chunk files
  exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

GOLDEN = Path(__file__).parent / "fixtures" / "example_dag_files.json"
RECORD = os.environ.get("ABP_RECORD_GOLDEN") == "1"
RUNS = ((1200, "first"), (1500, "grown"), (1500, "unchanged"))
# Added to each descriptor by ChunkOperator after the chunk files are published (see module doc).
ESTIMATE_KEYS = ("cost_upper_bound_usd", "cost_expected_usd", "estimated_input_tokens")


def _normalised(data: bytes, job_dir: Path, output_dir: Path) -> bytes:
    return data.replace(str(job_dir).encode(), b"$JOB_DIR").replace(str(output_dir).encode(), b"$OUTPUT_DIR")


def _digests(folder: Path, job_dir: Path, output_dir: Path) -> dict[str, str]:
    """Return {relative path: sha256} of every file under ``folder`` (paths normalised first)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(_normalised(path.read_bytes(), job_dir, output_dir)).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != "_REPORT.html"
    }


def _chunk_task_output(dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """Return what the chunk task returned (its XCom), read from the metadata DB."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dag_id, run_id=run_id, task_id="chunk", key="return_value", map_index=-1)
            .one()
        )
        value = row.value
    return json.loads(value) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def airflow_db() -> None:
    """Migrate the test metadata DB (``dag.test()`` needs it)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)


@pytest.fixture
def fresh_emulator(monkeypatch: pytest.MonkeyPatch):
    """A new emulator (its id counter starts at 0) whose batches end only when their status is read."""
    from airflow_batch_emulator.config import EmulatorConfig
    from airflow_batch_emulator.faults import Faults
    from airflow_batch_emulator.pytest_plugin import connection_env
    from airflow_batch_emulator.server import BatchEmulator

    emulator = BatchEmulator(EmulatorConfig(latency=0.02, faults=Faults(polls_before_done=1))).start()
    try:
        for name, value in connection_env(emulator).items():
            monkeypatch.setenv(name, value)
        yield emulator
    finally:
        emulator.stop()


def _run(dag: Any, tmp_path: Path, provider: str, rows: int, name: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    work = tmp_path / f"jobs-{name}"
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(work))
    output_dir = tmp_path / "out"
    run = dag.test(
        run_conf={
            "rows": rows,
            "provider": provider,
            "data_dir": str(tmp_path / "data"),
            "output_dir": str(output_dir),
            "poll_interval": 0.1,
        }
    )
    assert run.state == "success"
    (job_dir,) = work.glob("*/*/chunk")
    returned = _chunk_task_output(dag.dag_id, run.run_id)
    descriptors = json.loads(_normalised(json.dumps(returned).encode(), job_dir, output_dir))
    result = {
        "job_folder": _digests(job_dir, job_dir, output_dir),
        "output": _digests(output_dir, job_dir, output_dir),
        "chunk_descriptors": descriptors,
        "manifest": json.loads(_normalised((job_dir / "chunks" / "manifest.json").read_bytes(), job_dir, output_dir)),
    }
    _account_for_retention(result)
    return result


def _account_for_retention(run: dict) -> None:
    """Put back the request files' digests that retention removed after the merge (docs/retention.md).

    The merge removes each chunk's request body and writes ``merged.json`` (which holds the time of
    the merge, so it is not compared). The manifest's ``fingerprint`` is the sha256 of the request
    file as written, so the bytes sent are still compared with the recorded run's.
    """
    files = run["job_folder"]
    assert files.pop("merged.json", None) is not None, "retention did not run after the merge"
    for descriptor in run["manifest"]:
        name = f"chunks/{Path(descriptor['requests_path']).name}"
        assert name not in files, f"{name} was left behind after the merge"
        files[name] = descriptor["fingerprint"]


@pytest.mark.scenario
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_example_dag_files_are_byte_identical_to_the_recorded_run(
    airflow_db, fresh_emulator, provider, tmp_path, monkeypatch
):
    """Two runs of the example DAG (the second carries unchanged rows) give the recorded files."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    got = {name: _run(dag, tmp_path, provider, rows, name, monkeypatch) for rows, name in RUNS}
    if RECORD:
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        for run in got.values():
            run.pop("manifest")  # recorded from the descriptors, see the module docstring
        recorded[provider] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        pytest.fail(f"recorded {GOLDEN}; unset ABP_RECORD_GOLDEN and run again")
    want = json.loads(GOLDEN.read_text())[provider]
    for _, name in RUNS:
        run, expected = got[name], want[name]
        assert run["output"] == expected["output"], f"{name} run: the merged output changed"
        assert run["job_folder"] == expected["job_folder"], f"{name} run: a job folder file changed"
        assert run["chunk_descriptors"] == expected["chunk_descriptors"], f"{name} run: the descriptors changed"
        final = [{k: v for k, v in d.items() if k not in ESTIMATE_KEYS} for d in expected["chunk_descriptors"]]
        assert run["manifest"] == final, f"{name} run: manifest.json is not the final descriptors"
