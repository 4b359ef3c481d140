"""Every example DAG loads, and the example DAG runs end to end under ``dag.test()`` on the emulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.backends.registry import backend_names
from airflow_batch_provider.operators.batch_job import LLMBatchJob
from tests.conftest import REPO_ROOT
from tests.support import write_distribution

DAG_FILES = sorted((REPO_ROOT / "dags").glob("*.py"))


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Migrate the test metadata DB once per session (``dag.test()`` needs it)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(), capture_output=True)


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO_ROOT / "dags"))


def test_every_dag_file_loads_without_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert len(DAG_FILES) >= 1
    loaded_files = {Path(d.fileloc).name for d in dagbag.dags.values()}
    assert {f.name for f in DAG_FILES} <= loaded_files


# What a DAG file must not import at parse time: the dag-processor parses every file again and again
# (and `dags test` twice), and each of these costs 0.1-0.4 s or more. Tasks import them when they run.
HEAVY_AT_PARSE = ("openai", "anthropic", "boto3", "tiktoken", "redis", "vllm", "matplotlib", "fastapi")


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.stem)
def test_parsing_a_dag_file_imports_no_sdk(dag_file):
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('dag', {str(dag_file)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        f"print(sorted(m for m in {HEAVY_AT_PARSE!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", f"{dag_file.name} imports at parse time: {done.stdout}"


def test_dags_parse_without_the_emulator_distribution():
    """The example DAGs are for users, who install the provider alone: parsing needs no demo package.

    Their first task imports the demo data (``airflow_batch_emulator.examples``) only when it runs.
    """
    code = (
        "import sys\n"
        "sys.modules['airflow_batch_emulator'] = None  # as if not installed: every import of it fails\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO_ROOT / 'dags')!r})\n"
        "print(repr(sorted(bag.import_errors.items())), len(bag.dags))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    errors, _, count = done.stdout.strip().splitlines()[-1].rpartition(" ")
    assert errors == "[]" and int(count) >= len(DAG_FILES), done.stdout


def test_example_dag_shape(dagbag):
    dag = dagbag.dags["nightly_product_classification"]
    assert set(dag.task_ids) == {"make_products", "chunk", "submit", "wait", "merge"}
    assert dag.params["rows"] == 100
    assert dag.params["max_failure_ratio"] == 0.05
    assert dag.get_task("merge").max_failure_ratio == "{{ params.max_failure_ratio }}"
    (outlet,) = dag.get_task("merge").outlets  # downstream DAGs can be scheduled on the merged output
    assert outlet.name == "classified_products"
    assert dag.get_task("chunk").skip_unchanged is True
    assert dag.get_task("wait").partial_kwargs.get("deferrable") is None  # the deployment's default_deferrable
    (job,) = [group for group in dag.task_group_dict.values() if isinstance(group, LLMBatchJob)]  # one factory call
    assert set(job.children) == {"chunk", "submit", "wait", "merge"} and job.merge is dag.get_task("merge")


def test_unpausing_a_dag_never_starts_a_large_job(dagbag):
    """A run the scheduler starts by itself (unpausing, then each interval) has no conf: it takes the
    Params' defaults. So a DAG that the scheduler can start on its own must default to a small job.
    tests/scheduler/test_standalone_recipe.py checks the same under a real scheduler."""
    scheduled = [dag for dag in dagbag.dags.values() if dag.timetable.can_be_scheduled]
    assert "nightly_product_classification" in {dag.dag_id for dag in scheduled}
    for dag in scheduled:
        if "maintenance" in dag.tags:  # batch_maintenance sends nothing (it lists and cancels batches)
            continue
        # A streaming DAG (stream_intake, @continuous) sends at most one group of max_items per run.
        rows = dag.params.get("rows", dag.params.get("max_items"))
        assert rows is not None, f"{dag.dag_id} is scheduled but has no rows Param: say what its runs send"
        assert rows < 10_000, f"{dag.dag_id}: unpausing it would start a scheduled run of {rows:,} rows"


def test_every_default_model_of_the_example_dags_has_a_price(dagbag):
    """Every model a paid batch API gets by default: otherwise a run shows cost "n/a" and max_cost_usd
    fails with "no price known"."""
    from airflow_batch_provider.cost.pricing import load_pricing
    from airflow_batch_provider.operators.chunk import ChunkOperator

    pricing = load_pricing()
    checked = set()
    for dag in dagbag.dags.values():
        if not any(task.task_type == "SubmitBatchOperator" for task in dag.tasks):  # mapped ones too
            continue  # self-hosted models run on your own GPUs: no price list applies
        for task in dag.tasks:
            if not isinstance(task, ChunkOperator):
                continue
            if "{{" not in task.model:
                models = {task.model}
            elif "default_models" not in task.model:  # "{{ params.model }}": the Param's default is the model
                models = {dag.params["model"]}
            else:  # "{{ params.model or default_models.get(params.provider, '') }}": each backend's default
                assert not dag.params["model"], f"{dag.dag_id}: the model Param's default should be empty"
                models = set(dag.user_defined_macros["default_models"].values())
                assert set(dag.user_defined_macros["default_models"]) == set(backend_names())
            for model in models:
                assert pricing.get(model) is not None, f"{dag.dag_id}.{task.task_id}: no price for {model!r}"
                checked.add(model)
    assert {"gpt-4o-mini", "claude-haiku-4-5"} <= checked


ACME_BACKEND = """
from airflow_batch_provider.backends.openai import OpenAIBackend

class AcmeBackend(OpenAIBackend):
    name = "acme"
    title = "Acme Batch"
    default_model = "acme-small"
"""


def test_a_backend_from_another_package_runs_in_the_shipped_dag_unedited(tmp_path):
    """An installed distribution registers a backend by entry point: the nightly DAG offers it as a
    provider (no closed enum refuses it) and, with no model given, uses the model the backend names."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "acme_batch.py").write_text(ACME_BACKEND)
    write_distribution(site, "acme-batch", {"airflow_batch_provider.backends": {"acme": "acme_batch:AcmeBackend"}})
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"dag = DagBag(dag_folder={str(REPO_ROOT / 'dags' / 'nightly_product_classification.py')!r}).dags"
        "['nightly_product_classification']\n"
        "dag.params.get_param('provider').resolve('acme')  # a closed enum raised ParamValidationError here\n"
        "chunk = dag.get_task('chunk')\n"
        "context = {'params': {'model': '', 'provider': 'acme'}, **dag.user_defined_macros}\n"
        "print(chunk.render_template(chunk.model, context, dag.get_template_env()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "acme-small"


@pytest.mark.scenario
def test_max_failure_ratio_param_reaches_the_merge(airflow_db, openai_conn, tmp_path, monkeypatch):
    """3% truncated answers pass the default 0.05 (see above) but not a Param of 0.01; null turns it off."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    openai_conn.set_faults(truncate_rate=0.03)
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    conf = {"rows": 800, "data_dir": str(tmp_path / "data"), "poll_interval": 0.2, "max_failure_ratio": 0.01}
    run = dag.test(run_conf={**conf, "output_dir": str(tmp_path / "strict")})
    assert run.state == "failed"
    assert {ti.task_id: ti.state for ti in run.get_task_instances()}["merge"] == "failed"
    assert (tmp_path / "strict" / "_SUMMARY.json").exists()  # everything written before the verdict
    lenient = dag.test(run_conf={**conf, "max_failure_ratio": None, "output_dir": str(tmp_path / "lenient")})
    assert lenient.state == "success"


@pytest.mark.scenario
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_example_dag_end_to_end(airflow_db, openai_conn, anthropic_conn, provider, tmp_path, monkeypatch):
    """3,000 rows through chunk → submit → wait → merge, per provider; the output is checked row by row."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_batch_emulator.examples import synthetic_products

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    labels = dag.get_task("chunk").response_schema["properties"]["label"]["enum"]
    out = tmp_path / "out"
    run = dag.test(
        run_conf={
            "rows": 3000,
            "provider": provider,
            "data_dir": str(tmp_path / "data"),
            "output_dir": str(out),
            "poll_interval": 0.2,
        }
    )
    assert run.state == "success"
    merged = pq.read_table(out).to_pylist()
    source = synthetic_products(3000).to_pylist()
    assert len(merged) == 3000
    assert [r["product_id"] for r in merged] == [r["product_id"] for r in source]
    assert len({r["custom_id"] for r in merged}) == 3000
    for got, want in zip(merged, source):
        assert got["custom_id"] == want["product_id"]
        assert (got["title"], got["description"], got["price"]) == (want["title"], want["description"], want["price"])
        assert got["status"] == "succeeded" and got["response"], got
        assert got["label"] in labels  # structured output, validated and split into columns
        assert 0 <= got["confidence"] <= 1
    stats = openai_conn.stats()[provider]
    assert stats["batches_created"] == 1  # 3,000 rows at chunk_size 10,000
    assert stats["requests_processed"] == 3000
    other = "anthropic" if provider == "openai" else "openai"
    assert openai_conn.stats()[other]["batches_created"] == 0
    assert_no_descriptor_in_rendered_fields(dag.dag_id, run.run_id)


def assert_no_descriptor_in_rendered_fields(dag_id: str, run_id: str) -> None:
    """The rendered fields the run stored hold no copy of a chunk descriptor (XCom already holds it).

    Before: the submit's ``chunk``, the wait's ``batch`` and the merge's ``batches`` were template
    fields, so every task instance stored its descriptor a second time (2.8 KB per chunk at 100 chunks).
    """
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(RenderedTaskInstanceFields).filter_by(dag_id=dag_id, run_id=run_id).all()
        stored = {row.task_id: row.rendered_fields for row in rows}
    assert {"submit", "wait", "merge"} <= set(stored), stored.keys()
    for task_id, fields in stored.items():
        assert "requests_path" not in str(fields) and "rows_path" not in str(fields), (task_id, fields)


@pytest.mark.scenario
def test_cost_guard_stops_the_dag_before_any_upload(airflow_db, openai_conn, tmp_path, monkeypatch, capsys, caplog):
    """max_cost_usd below the estimate: the chunk task fails, the provider never sees a file, and the
    DAG's failure callback logs its alert (the task SDK's RuntimeTaskInstance has no ``ti.log``)."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    run = dag.test(
        run_conf={
            "rows": 500,
            "data_dir": str(tmp_path / "data"),
            "output_dir": str(tmp_path / "out"),
            "max_cost_usd": 0.000001,
        }
    )
    assert run.state == "failed"
    stats = openai_conn.stats()["openai"]
    assert stats["files_uploaded"] == 0 and stats["batches_created"] == 0
    logged = capsys.readouterr()  # task logs reach stdout (structlog) or the logging capture, by test order
    logged_text = logged.out + logged.err + caplog.text
    assert (
        "ALERT nightly_product_classification.chunk[-1]: cost guard — " in logged_text and "max_cost_usd" in logged_text
    )
    assert "Failed to run task callback" not in logged_text and "AttributeError" not in logged_text


@pytest.mark.scenario
def test_reprocessing_sends_only_what_changed(airflow_db, openai_conn, tmp_path, monkeypatch):
    """Same run twice → nothing sent; 1,000 more rows → only those; a new prompt version → every row."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["reprocess_after_prompt_change"]
    out = tmp_path / "out"

    def run(rows: int, version: int) -> tuple[int, list[dict]]:
        before = openai_conn.stats()["openai"]["requests_processed"]
        conf = {
            "rows": rows,
            "prompt_version": version,
            "data_dir": str(tmp_path / "data"),
            "output_dir": str(out),
            "poll_interval": 0.2,
        }
        assert dag.test(run_conf=conf).state == "success"
        merged = pq.read_table(out).to_pylist()
        assert len(merged) == rows and len({m["custom_id"] for m in merged}) == rows
        assert all(m["status"] == "succeeded" and m["response"] for m in merged)
        return openai_conn.stats()["openai"]["requests_processed"] - before, merged

    sent, first = run(2000, 1)
    assert sent == 2000 and {m["attempts"] for m in first} == {1}
    sent, again = run(2000, 1)
    assert sent == 0
    assert [(m["custom_id"], m["response"], m["batch_id"]) for m in again] == [
        (m["custom_id"], m["response"], m["batch_id"]) for m in first
    ]  # stored results kept, from the batch that produced them
    assert {m["attempts"] for m in again} == {0}
    sent, grown = run(3000, 1)
    assert sent == 1000
    assert {m["custom_id"] for m in grown if m["attempts"] == 1} == {m["custom_id"] for m in grown[2000:]}
    sent, _ = run(3000, 2)
    assert sent == 3000


@pytest.mark.scenario
def test_truncated_answers_are_final_reported_by_kind_and_not_paid_for_again(
    airflow_db, openai_conn, tmp_path, monkeypatch
):
    """3% of answers cut off at max_tokens: invalid_output saying finish_reason=length, grouped as one
    error kind, counted in the summary; the same run again sends nothing (same request, same answer)."""
    import orjson
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    openai_conn.set_faults(truncate_rate=0.03)
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    out = tmp_path / "out"
    conf = {"rows": 1500, "data_dir": str(tmp_path / "data"), "output_dir": str(out), "poll_interval": 0.2}
    assert dag.test(run_conf=conf).state == "success"
    first = pq.read_table(out).to_pylist()
    cut = [m for m in first if m["finish_reason"] == "length"]
    assert 20 < len(cut) < 80
    assert {(m["status"], m["error_code"]) for m in cut} == {("invalid_output", "truncated")}
    assert all("finish_reason=length" in m["error"] for m in cut)
    summary = orjson.loads((out / "_SUMMARY.json").read_bytes())
    assert summary["truncated_rows"] == len(cut)
    ((kind, count),) = summary["top_errors"]
    assert kind.startswith("invalid_output/truncated: answer cut off at max_tokens") and count == len(cut)
    before = openai_conn.stats()["openai"]["requests_processed"]
    assert dag.test(run_conf=conf).state == "success"
    assert openai_conn.stats()["openai"]["requests_processed"] == before  # nothing paid for twice
    again = orjson.loads((out / "_SUMMARY.json").read_bytes())
    assert again["requests_sent"] == 0 and again["carried_rows"] == 1500
    assert pq.read_table(out).column("status").to_pylist() == [m["status"] for m in first]


class _RecordingStats:
    """Stands in for Airflow's ``Stats`` facade: no StatsD/OTel backend is installed here (statsd is
    not a dependency), so the test records what the operators hand to the facade instead."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, dict]] = []

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict | None = None) -> None:
        self.calls.append(("incr", stat, count, dict(tags or {})))

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: dict | None = None) -> None:
        self.calls.append(("gauge", stat, value, dict(tags or {})))

    def total(self, stat: str) -> float:
        return sum(value for kind, name, value, _ in self.calls if name == stat and kind == "incr")

    def last(self, stat: str) -> float:
        return [value for kind, name, value, _ in self.calls if name == stat and kind == "gauge"][-1]


@pytest.mark.scenario
def test_a_dag_run_emits_the_documented_metrics(airflow_db, openai_conn, tmp_path, monkeypatch):
    """The example DAG's tasks emit llm_batch.* with the run's real figures, tagged provider/model/dag_id."""
    from airflow.dag_processing.dagbag import DagBag

    stats = _RecordingStats()
    monkeypatch.setattr("airflow_batch_provider.metrics.airflow_stats", lambda: stats)
    monkeypatch.setenv("AIRFLOW__LLM_BATCH__WORK_DIR", str(tmp_path / "jobs"))
    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).dags["nightly_product_classification"]
    conf = {"rows": 1500, "data_dir": str(tmp_path / "data"), "output_dir": str(tmp_path / "out"), "poll_interval": 0.2}
    assert dag.test(run_conf=conf).state == "success"
    merged = pq.read_table(tmp_path / "out").to_pylist()

    assert stats.total("llm_batch.results.succeeded") == 1500
    assert stats.total("llm_batch.batches.completed") == 1  # one chunk of up to 10,000
    assert stats.total("llm_batch.tokens.input") == sum(r["input_tokens"] for r in merged)
    assert stats.total("llm_batch.tokens.output") == sum(r["output_tokens"] for r in merged)
    assert stats.last("llm_batch.batch_fill_rate") == pytest.approx(1500 / 10_000)
    assert stats.last("llm_batch.cost_usd.actual") > 0
    assert stats.last("llm_batch.cost_usd.realtime_equivalent") > stats.last("llm_batch.cost_usd.actual")
    names = {name for _, name, _, _ in stats.calls}
    assert {"llm_batch.cost_usd.upper_bound", "llm_batch.cost_usd.expected", "llm_batch.chunks_waiting"} <= names
    # The example's answers are an enum label and a number: expected well below the max_tokens=64 bound.
    assert stats.last("llm_batch.cost_usd.expected") < stats.last("llm_batch.cost_usd.upper_bound") / 2
    assert all(name.startswith("llm_batch.") for name in names)
    for _, name, _, tags in stats.calls:
        assert tags["provider"] == "openai" and tags["model"] == "gpt-4o-mini", (name, tags)
        assert tags["dag_id"] == "nightly_product_classification", (name, tags)
