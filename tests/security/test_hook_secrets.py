"""Issue 25: ``vars()`` and pickles of ``OpenAICompatibleHook`` held the API key and the header values.

A hook travels with an operator or a trigger (and lands in tracebacks' locals): it keeps the
connection id, and builds the client arguments, secrets included, only for the call.
"""

from __future__ import annotations

import json
import pickle

import pytest

from airflow_batch_provider.hooks.openai_compatible import OpenAICompatibleHook

pytestmark = pytest.mark.security


def test_the_openai_compatible_hook_keeps_no_secret_in_its_state(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "openai_compatible", "host": "http://127.0.0.1:1/v1", "password": "sk-very-secret-key",
            "extra": {"headers": {"X-Gateway-Token": "gateway-secret-value"}}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_OPENAI_COMPATIBLE_DEFAULT", json.dumps(conn))
    hook = OpenAICompatibleHook()
    assert hook.client_kwargs["api_key"] == "sk-very-secret-key"  # used: built for the call
    assert hook.base_url.startswith("http://127.0.0.1:1")
    state = repr(vars(hook)) + repr(pickle.dumps(hook))
    assert "sk-very-secret-key" not in state and "gateway-secret-value" not in state
