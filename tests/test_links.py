"""The 'Provider batch' extra link and the mapped-task names."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.get_provider_info import get_provider_info
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.links import BatchConsoleLink, console_url
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from airflow_batch_provider.sensors.batch import BatchCompleteSensor
from tests.support import make_context, write_chunk


def test_link_is_registered_and_attached():
    assert "airflow_batch_provider.links.BatchConsoleLink" in get_provider_info()["extra-links"]
    for op_class in (SubmitBatchOperator, BatchCompleteSensor):
        assert any(isinstance(link, BatchConsoleLink) for link in op_class.operator_extra_links)


def test_a_batch_of_the_emulator_gets_no_console_link(openai_conn, tmp_path):
    """platform.openai.com has never seen a batch the emulator made: no button rather than a dead one."""
    op = SubmitBatchOperator(task_id="submit", chunk=write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]))
    result = op.execute(make_context())
    assert result["batch_id"]
    assert BatchConsoleLink().get_link(op, ti_key=None) == ""
    sensor = BatchCompleteSensor(task_id="wait", batch=result, deferrable=False, poll_interval=0.1)
    sensor.execute(make_context())
    assert BatchConsoleLink().get_link(sensor, ti_key=None) == ""


@pytest.mark.parametrize(
    ("conn", "expected"),
    [
        # No host: the SDK's default, the real API → its console.
        ({"conn_type": "openai_batch", "password": "k"}, "https://platform.openai.com/batches/batch_1"),
        (
            {"conn_type": "openai_batch", "password": "k", "host": "https://eu.api.openai.com/v1"},
            "https://platform.openai.com/batches/batch_1",
        ),
        ({"conn_type": "openai_batch", "password": "k", "host": "http://127.0.0.1:8089/v1"}, None),
        ({"conn_type": "openai_batch", "password": "k", "extra": {"base_url": "https://llm-proxy.corp/v1"}}, None),
        (
            {"conn_type": "anthropic_batch", "password": "k"},
            "https://console.anthropic.com/workspaces/default/batches/batch_1",
        ),
        ({"conn_type": "anthropic_batch", "password": "k", "host": "http://127.0.0.1:8089"}, None),
    ],
)
def test_console_link_follows_the_connection_base_url(monkeypatch, conn, expected):
    """The link is built from the base URL the hook's real SDK client talks to (no request is made)."""
    provider = "openai" if conn["conn_type"] == "openai_batch" else "anthropic"
    monkeypatch.setenv(f"AIRFLOW_CONN_{provider.upper()}_BATCH_DEFAULT", json.dumps(conn))
    assert get_batch_hook(provider).batch_url("batch_1") == expected


def test_console_url_needs_the_providers_own_https_host():
    assert console_url("openai", "https://api.openai.com/v1", "b") == "https://platform.openai.com/batches/b"
    assert console_url("openai", "https://api.openai.com.evil.example/v1", "b") is None
    assert console_url("openai", "http://api.openai.com/v1", "b") is None
    assert console_url("anthropic", "https://api.openai.com/v1", "b") is None
    assert console_url("openai", "https://api.openai.com/v1", "") is None
    assert console_url("vllm", "https://api.openai.com/v1", "b") is None


def test_mapped_tasks_are_named_after_their_chunk():
    """.partial() must keep the operators' map_index_template (a kwargs.setdefault would be lost)."""
    from airflow.sdk import DAG

    with DAG("names", schedule=None):
        submit = SubmitBatchOperator.partial(task_id="submit").expand(chunk=[{"label": "chunk 1/1"}])
        wait = BatchCompleteSensor.partial(task_id="wait").expand(batch=[{"label": "chunk 1/1"}])
    assert submit.partial_kwargs["map_index_template"] == "{{ task.chunk['label'] }}"
    assert wait.partial_kwargs["map_index_template"] == "{{ task.batch['label'] }}"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_connection_that_cannot_be_read_gives_no_link_instead_of_failing(monkeypatch, provider):
    """The link is cosmetic: a sensor finishing its batch must not fail because of it."""
    monkeypatch.delenv(f"AIRFLOW_CONN_{provider.upper()}_BATCH_DEFAULT", raising=False)
    assert get_batch_hook(provider).batch_url("batch_1") is None  # no such connection
    monkeypatch.setenv(f"AIRFLOW_CONN_{provider.upper()}_BATCH_DEFAULT", json.dumps({"conn_type": f"{provider}_batch"}))
    assert get_batch_hook(provider).batch_url("batch_1") is None  # no API key
