"""The SDK transport's 'HTTP Request: …' INFO line per call stays out of task and triggerer logs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from airflow_batch_provider.utils.http_logs import TRANSPORT_LOGGERS
from tests.support import write_chunk


@pytest.fixture
def unset_transport_levels(monkeypatch):
    """Start each test with the transport loggers unset, as in a fresh task process (restored after)."""
    for name in TRANSPORT_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)


def _transport_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in TRANSPORT_LOGGERS]


def test_polls_log_no_http_request_lines(openai_hook, tmp_path, caplog, unset_transport_levels):
    submitted = openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    caplog.clear()

    async def trigger_polls() -> None:
        for _ in range(3):
            await openai_hook.aget_state(submitted["batch_id"])
        await openai_hook.aclose()

    with caplog.at_level(logging.INFO):
        openai_hook.get_state(submitted["batch_id"])  # the sensor's poll
        asyncio.run(trigger_polls())  # the trigger's
    assert _transport_lines(caplog) == []
    assert logging.getLogger("httpx2").level == logging.WARNING


def test_anthropic_polls_log_no_http_request_lines(anthropic_hook, tmp_path, caplog, unset_transport_levels):
    line = {
        "custom_id": "a",
        "params": {"model": "claude-haiku-5-5", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
    }
    chunk = write_chunk(
        tmp_path, [{"custom_id": "a", "text": "x"}], lines=[line], endpoint="/v1/messages", model="claude-haiku-5-5"
    )
    submitted = anthropic_hook.submit({**chunk, "provider": "anthropic"}, metadata={})
    caplog.clear()
    with caplog.at_level(logging.INFO):
        anthropic_hook.get_state(submitted["batch_id"])
    assert _transport_lines(caplog) == []


def test_a_level_the_deployment_chose_is_kept(openai_hook, tmp_path, caplog, unset_transport_levels):
    """Someone debugging the transport sets its logger to INFO: the hook must not take that back."""
    logging.getLogger("httpx2").setLevel(logging.INFO)
    with caplog.at_level(logging.INFO):
        openai_hook.submit(write_chunk(tmp_path, [{"custom_id": "a", "text": "x"}]), metadata={})
    assert any(line.startswith("HTTP Request: POST") for line in _transport_lines(caplog))
