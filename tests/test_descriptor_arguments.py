"""Descriptors reach submit, wait and self-hosted tasks through ``.expand()`` only; anything else fails at parse.

They are not template fields (a rendered copy per task instance cost 2.8 KB of metadata DB per chunk),
so an XCom reference given to the constructor would never be resolved: the DAG must fail to load
with a message that says how to map instead, not fail at run time with a TypeError deep in a task.
"""

from __future__ import annotations

import datetime

import pytest
from airflow.sdk import DAG, task

from airflow_batch_provider.operators.server import ServerGenerateOperator
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.sensors.batch import BatchCompleteSensor

OPERATORS = [(SubmitBatchOperator, "chunk"), (BatchCompleteSensor, "batch"), (ServerGenerateOperator, "chunk")]


@pytest.mark.parametrize(("operator", "argument"), OPERATORS, ids=lambda o: getattr(o, "__name__", o))
def test_an_xcom_reference_is_refused_with_the_expand_form(operator, argument):
    with DAG("descriptor_arguments", schedule=None, start_date=datetime.datetime(2026, 1, 1)):

        @task
        def one_descriptor() -> dict:
            return {}

        with pytest.raises(TypeError) as refused:
            operator(task_id="step", **{argument: one_descriptor()})
    message = str(refused.value)
    assert message.startswith(f"step: {argument} takes one descriptor (a dict), got an XCom reference")
    assert f"{operator.__name__}.partial(task_id='step', ...).expand({argument}=<upstream>.output)" in message


@pytest.mark.parametrize(("operator", "argument"), OPERATORS, ids=lambda o: getattr(o, "__name__", o))
def test_a_template_string_is_refused(operator, argument):
    with pytest.raises(TypeError, match=f"step: {argument} takes one descriptor \\(a dict\\), got str"):
        operator(task_id="step", **{argument: "{{ ti.xcom_pull(task_ids='chunk')[0] }}"})


def test_descriptors_are_not_template_fields():
    """The mapped value is already resolved; rendering it again would only store a copy of it."""
    assert "chunk" not in SubmitBatchOperator.template_fields
    assert "batch" not in BatchCompleteSensor.template_fields
    assert "chunk" not in ServerGenerateOperator.template_fields
