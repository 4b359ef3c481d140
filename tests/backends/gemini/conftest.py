"""Fixtures of the Gemini backend tests: a ``gemini`` connection on the emulator, and a hook on it."""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.utils.retry import RetryPolicy
from tests.support import write_chunk

MODEL = "gemini-2.5-flash"
SCHEMA = {
    "title": "classification",
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["toys", "tools"]}, "confidence": {"type": "number"}},
    "required": ["label", "confidence"],
}


@pytest.fixture
def gemini_conn(batch_emulator, monkeypatch):
    """Point the default ``gemini`` connection at the emulator's base URL; return the emulator."""
    conn = {"conn_type": "gemini", "host": batch_emulator.url, "password": "emulator-key"}
    monkeypatch.setenv("AIRFLOW_CONN_GEMINI_DEFAULT", json.dumps(conn))
    return batch_emulator


@pytest.fixture
def gemini_hook(gemini_conn):
    """A GeminiBatchHook on the emulator, with quick retries."""
    from airflow_batch_provider.backends.gemini.hook import GeminiBatchHook

    return GeminiBatchHook(retry_policy=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05))


def gemini_chunk(tmp_path, count: int, *, schema=SCHEMA, index: int = 0, **params):
    """Write a chunk of ``count`` Gemini requests rendered by the real renderer; return its descriptor."""
    from airflow_batch_provider.chunking.spec import renderer_for

    spec = RequestSpec(
        provider="gemini",
        model=MODEL,
        system_prompt="Classify the product.",
        params={"max_tokens": 64, **params},
        response_schema=schema,
    )
    renderer = renderer_for(spec)
    rows = [{"custom_id": f"row-{index}-{i}", "text": f"product {i}"} for i in range(count)]
    lines = [renderer.request_dict(r["custom_id"], r["text"]) for r in rows]
    chunk = write_chunk(tmp_path / f"job{index}", rows, index=index, lines=lines, endpoint=spec.endpoint, model=MODEL)
    return {**chunk, "provider": "gemini"}
