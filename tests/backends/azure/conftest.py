"""Fixtures of the Azure OpenAI backend tests: an ``azure_openai_batch`` connection on the emulator, a hook on it."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.support import write_chunk

DEPLOYMENT = "gpt-4o-mini"  # a global-batch deployment named after its model (so the price table knows it)
SCHEMA = {
    "title": "classification",
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["toys", "tools"]}, "confidence": {"type": "number"}},
    "required": ["label", "confidence"],
    "additionalProperties": False,
}


def azure_connection(emulator, **extra) -> dict:
    """An ``azure_openai_batch`` connection whose endpoint is the emulator (``extra`` overrides the extras)."""
    return {
        "conn_type": "azure_openai_batch",
        "host": emulator.url,
        "password": "emulator-key",
        "extra": {"api_version": "2024-10-21", **extra},
    }


@pytest.fixture
def azure_conn(batch_emulator, monkeypatch):
    """Point ``azure_openai_batch_default`` at the emulator; return the emulator."""
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_OPENAI_BATCH_DEFAULT", json.dumps(azure_connection(batch_emulator)))
    return batch_emulator


@pytest.fixture
def azure_hook(azure_conn):
    """An AzureOpenAIBatchHook on the emulator, with quick retries."""
    from airflow_batch_provider.backends.azure.hook import AzureOpenAIBatchHook

    return AzureOpenAIBatchHook(retry_policy=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05))


def azure_chunk(tmp_path, count: int, *, index: int = 0):
    """Write a chunk of ``count`` requests rendered by the Azure backend's renderer; return its descriptor."""
    from airflow_batch_provider.chunking.spec import renderer_for

    spec = RequestSpec(
        provider="azure", model=DEPLOYMENT, system_prompt="Classify.", params={"max_tokens": 32}, response_schema=SCHEMA
    )
    renderer = renderer_for(spec)
    rows = [{"custom_id": f"row-{index}-{i}", "text": f"product {i}"} for i in range(count)]
    lines = [renderer.request_dict(r["custom_id"], r["text"]) for r in rows]
    chunk = write_chunk(
        tmp_path / f"job{index}", rows, index=index, lines=lines, endpoint=spec.endpoint, model=DEPLOYMENT
    )
    return {**chunk, "provider": "azure"}
