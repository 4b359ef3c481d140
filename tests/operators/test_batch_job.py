"""``llm_batch_job``: every operator argument reaches its task, templates stay templates, mistakes fail at parse."""

from __future__ import annotations

import inspect
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk import DAG, Asset, BaseOperator, task

from airflow_batch_provider.operators import llm_batch_job
from airflow_batch_provider.operators.batch_job import LINEAGE, STEPS, WIRED, route, steps_taking

REQUIRED = {"source": "/data/products.parquet", "prompt_template": "Classify: {title}", "model": "gpt-4o-mini"}
REQUIRED_MERGE = {"output_dir": "/data/out"}


def _job(dag_id: str = "job", group_id: str = "classify", **arguments):
    with DAG(dag_id, schedule=None) as dag:
        job = llm_batch_job(group_id, **{**REQUIRED, **REQUIRED_MERGE, **arguments})
    return dag, job


def _arguments(cls: type) -> set[str]:
    """What an operator's constructor takes, read from the signatures here (not from the factory's tables)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, BaseOperator)):
            break
        for param in inspect.signature(klass.__init__).parameters.values():
            if param.kind is param.KEYWORD_ONLY or param.kind is param.POSITIONAL_OR_KEYWORD:
                names.add(param.name)
    return names - {"self"} - set(WIRED) - {"default_args"}


@pytest.mark.parametrize("step", list(STEPS))
def test_every_argument_of_every_operator_reaches_its_task(step):
    cls = STEPS[step]
    for name in sorted(_arguments(cls)):
        expected = LINEAGE.get(name, step)
        assert expected in steps_taking(name), f"{cls.__name__}({name}=...) is not reachable through llm_batch_job"
        assert expected in route({name: "value"}), name
        assert route({name: "value"})[expected][name] == "value"


def test_the_tasks_get_what_they_own_and_shared_arguments_go_to_each():
    pricing = {"gpt-4o-mini": [0.15, 0.6]}
    classified = Asset(name="classified", uri="file:///classified")
    dag, job = _job(
        system_prompt="Be brief.",
        conn_id="my_openai",
        poll_interval=7,
        max_failure_ratio=0.2,
        pricing=pricing,
        retries=4,
        outlets=[classified],
        per_task={"wait": {"retries": 9}},
    )
    chunk, submit, wait, merge = (dag.get_task(f"classify.{step}") for step in STEPS)
    assert (chunk.system_prompt, chunk.pricing, chunk.model, chunk.source) == (
        "Be brief.",
        pricing,
        "gpt-4o-mini",
        "/data/products.parquet",
    )
    assert submit.partial_kwargs["conn_id"] == wait.partial_kwargs["conn_id"] == merge.conn_id == "my_openai"
    assert chunk.conn_id == "my_openai"  # the chunk step's canary calls the job's connection too
    assert wait.partial_kwargs["poll_interval"] == 7 and merge.max_failure_ratio == 0.2 and merge.pricing == pricing
    assert chunk.retries == submit.partial_kwargs["retries"] == merge.retries == 4
    assert wait.partial_kwargs["retries"] == 9  # per_task wins for its task
    assert list(merge.outlets) == [classified] and not chunk.outlets  # only the merge writes the job's output
    assert job.merge is merge and job.output.operator is merge


def test_the_job_is_a_task_group_of_the_four_mapped_tasks_in_order():
    dag, job = _job()
    assert set(dag.task_ids) == {f"classify.{step}" for step in STEPS}
    assert dag.task_group_dict["classify"] is job
    assert dag.get_task("classify.submit").upstream_task_ids == {"classify.chunk"}
    assert dag.get_task("classify.wait").upstream_task_ids == {"classify.submit"}
    assert dag.get_task("classify.merge").upstream_task_ids == {"classify.wait"}
    assert dag.get_task("classify.submit").expand_input.value == {"chunk": dag.get_task("classify.chunk").output}
    assert dag.get_task("classify.wait").partial_kwargs.get("deferrable") is None  # deferred by default


def test_downstream_tasks_follow_the_merge_and_two_jobs_share_a_dag():
    with DAG("two_jobs", schedule=None) as dag:
        first = llm_batch_job("first", **REQUIRED, output_dir="/out/1")
        second = llm_batch_job("second", **REQUIRED, output_dir="/out/2")

        @task
        def report(summary: dict) -> None: ...

        done = report(first.output)
        second >> done
    assert dag.get_task("report").upstream_task_ids == {"first.merge", "second.merge"}
    assert len(dag.task_ids) == 9


def test_without_the_prefix_the_task_ids_are_the_step_names_and_group_defaults_apply():
    with DAG("plain", schedule=None) as dag:
        llm_batch_job("classify", prefix_group_id=False, default_args={"retries": 6}, **REQUIRED, **REQUIRED_MERGE)
    assert set(dag.task_ids) == set(STEPS)
    assert dag.get_task("chunk").retries == dag.get_task("merge").retries == 6


def test_templated_fields_stay_templated_and_render():
    templated = {
        step: [f for f in STEPS[step].template_fields if f not in WIRED and f not in REQUIRED] for step in STEPS
    }
    arguments = {f: "{{ params." + f + " }}" for fields in templated.values() for f in fields}
    dag, _ = _job(**arguments)
    for step, fields in templated.items():
        op = dag.get_task(f"classify.{step}")
        assert set(fields) <= set(op.template_fields), step
        given = op.partial_kwargs if step in ("submit", "wait") else vars(op)
        for field in fields:
            assert given[field] == arguments[field], (step, field)
    values = {f: f"value-of-{f}" for f in arguments} | {"chunk_size": "500", "max_failure_ratio": "0.1"}
    for step in ("chunk", "merge"):  # the unmapped ones render here as in a run
        op = dag.get_task(f"classify.{step}")
        for field in templated[step]:
            rendered = op.render_template(getattr(op, field), {"params": values}, dag.get_template_env())
            assert rendered == values[field], (step, field)


def test_an_argument_no_task_takes_names_the_tasks_and_what_each_accepts():
    with pytest.raises(TypeError) as caught:
        _job(promt_template="typo")
    message = str(caught.value)
    assert "no task of the job takes 'promt_template'" in message and "did you mean 'prompt_template'" in message
    for step, cls in STEPS.items():
        assert f"{step} ({cls.__name__}) takes: " in message
    assert "poll_interval" in message and "retries" in message


def test_per_task_checks_its_task_and_names_what_it_takes():
    taken_by_wait = r"(?s)task 'submit' does not take 'poll_interval' \(it is an argument of wait\).*submit \(Submit"
    with pytest.raises(TypeError, match=taken_by_wait):
        _job(per_task={"submit": {"poll_interval": 5}})
    with pytest.raises(TypeError, match=r"per_task names 'sensor'; the job's tasks are"):
        _job(per_task={"sensor": {"retries": 1}})


@pytest.mark.parametrize("wired", ["chunk", "batch", "batches", "task_id"])
def test_what_the_factory_wires_cannot_be_passed(wired):
    with pytest.raises(TypeError, match=f"llm_batch_job sets {wired!r} itself"):
        _job(**{wired: "x"})


def test_a_misspelt_argument_is_a_dag_import_error(tmp_path: Path):
    """At parse: the dag-processor shows the message as the file's import error, before any run."""
    (tmp_path / "typo_dag.py").write_text(
        "from airflow.sdk import DAG\n"
        "from airflow_batch_provider.operators import llm_batch_job\n"
        "with DAG('typo', schedule=None):\n"
        "    llm_batch_job('job', source='t.csv', prompt_template='{a}', model='gpt-4o-mini', output_dir='o',\n"
        "                  pool_interval=5)\n"
    )
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"print(list(DagBag(dag_folder={str(tmp_path)!r}).import_errors.values()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "no task of the job takes 'pool_interval' (did you mean 'poll_interval'?)" in done.stdout, done.stdout
    assert "wait (BatchCompleteSensor) takes: " in done.stdout


def test_airflow_task_arguments_go_to_all_four_and_sensor_ones_to_the_wait():
    dag, _ = _job(execution_timeout=timedelta(minutes=5), timeout=3600, mode="reschedule")
    for step in STEPS:
        op = dag.get_task(f"classify.{step}")
        kwargs = op.partial_kwargs if step in ("submit", "wait") else vars(op)
        assert kwargs["execution_timeout"] == timedelta(minutes=5), step
    assert dag.get_task("classify.wait").partial_kwargs["timeout"] == 3600
    assert steps_taking("mode") == ["wait"]
