"""The 'Provider batch' extra link and the mapped-task names."""

from __future__ import annotations

from airflow_batch_provider.get_provider_info import get_provider_info
from airflow_batch_provider.links import BatchConsoleLink
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.sensors.batch import BatchCompleteSensor
from tests.support import make_context, write_chunk


def test_link_is_registered_and_attached():
    assert "airflow_batch_provider.links.BatchConsoleLink" in get_provider_info()["extra-links"]
    for op_class in (SubmitBatchOperator, BatchCompleteSensor):
        assert any(isinstance(link, BatchConsoleLink) for link in op_class.operator_extra_links)


def test_submit_records_the_console_url(openai_conn, tmp_path):
    op = SubmitBatchOperator(task_id="submit", chunk=write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]))
    assert BatchConsoleLink().get_link(op, ti_key=None) == ""  # nothing before it ran
    result = op.execute(make_context())
    assert BatchConsoleLink().get_link(op, ti_key=None) == f"https://platform.openai.com/batches/{result['batch_id']}"


def test_mapped_tasks_are_named_after_their_chunk():
    """.partial() must keep the operators' map_index_template (a kwargs.setdefault would be lost)."""
    from airflow.sdk import DAG

    with DAG("names", schedule=None):
        submit = SubmitBatchOperator.partial(task_id="submit").expand(chunk=[{"label": "chunk 1/1"}])
        wait = BatchCompleteSensor.partial(task_id="wait").expand(batch=[{"label": "chunk 1/1"}])
    assert submit.partial_kwargs["map_index_template"] == "{{ task.chunk['label'] }}"
    assert wait.partial_kwargs["map_index_template"] == "{{ task.batch['label'] }}"
