"""GeminiBackend against the backend contract, and GeminiBatchHook keeping its API key out of its own state.

A hook travels with an operator or a trigger (pickled) and lands in tracebacks' locals: its SDK
clients, which hold the key, live beside it (see ``hook._CLIENTS``), never in ``vars(hook)``.
"""

from __future__ import annotations

import asyncio
import json
import pickle

import orjson

from airflow_batch_provider.backends.gemini.hook import GeminiBatchHook
from airflow_batch_provider.backends.registry import backend_for_model, get_backend
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.get_provider_info import get_provider_info
from tests.backends.gemini.conftest import MODEL, SCHEMA

SECRET = "gemini-very-secret-key"


def _secret_free(hook: GeminiBatchHook) -> bool:
    state = repr(vars(hook)) + repr(pickle.dumps(hook))
    return SECRET not in state


def test_the_hook_keeps_no_api_key_in_its_state(batch_emulator, monkeypatch):
    conn = {"conn_type": "gemini", "host": batch_emulator.url, "password": SECRET}
    monkeypatch.setenv("AIRFLOW_CONN_GEMINI_DEFAULT", json.dumps(conn))
    hook = GeminiBatchHook()
    assert list(hook.client.batches.list(config={"page_size": 1})) == []  # the key was used: a real call
    assert hook.client is hook.client  # built once per hook, not per call
    assert _secret_free(hook)

    async def use_async() -> None:
        client = await hook.aget_client()
        await client.batches.list(config={"page_size": 1})
        assert _secret_free(hook)
        await hook.aclose()

    asyncio.run(use_async())
    copy = pickle.loads(pickle.dumps(hook))  # an unpickled hook builds its own client from the connection
    assert copy.client is not hook.client and list(copy.client.batches.list(config={"page_size": 1})) == []


def test_the_backend_answers_the_pipeline_stages():
    backend = get_backend("gemini")
    assert backend.default_endpoint == "/v1beta/models:generateContent"
    assert backend.limits.max_requests == 50_000 and backend.limits.max_custom_id_chars == 512
    assert backend_for_model("gemini-2.5-flash") is backend and not backend.owns_model("gpt-4o-mini")
    assert backend.hook_class() is GeminiBatchHook
    assert backend.console_url("https://generativelanguage.googleapis.com", "batches/b-1") == (
        "https://aistudio.google.com/batches/b-1"
    )
    assert backend.console_url("http://127.0.0.1:8089", "batches/b-1") is None
    (conn,) = [c for c in get_provider_info()["connection-types"] if c["connection-type"] == "gemini"]
    assert conn["hook-class-name"] == "airflow_batch_provider.backends.gemini.hook.GeminiBatchHook"


def test_a_rendered_line_is_countable_and_its_result_parses():
    spec = RequestSpec(provider="gemini", model=MODEL, system_prompt="sys", params={"max_tokens": 9},
                       response_schema=SCHEMA)  # fmt: skip
    line = renderer_for(spec).request_dict("row-1", "hello")
    counted = get_backend("gemini").countable_request(line)
    assert counted is not None
    assert counted.body["prompt"][:2] == ["sys", "hello"] and counted.body["max_tokens"] == 9
    assert counted.typical_answer is not None and "label" in counted.typical_answer
    assert get_backend("openai").countable_request(line) is None  # another format: not OpenAI's
    answer = {"candidates": [{"content": {"parts": [{"text": "ok"}]}, "finishReason": "STOP"}]}
    for result in ({"key": "row-1", "response": answer}, orjson.dumps({"key": "row-1", "response": answer})):
        record = get_backend("gemini").parse_result(result)
        assert (record["custom_id"], record["status"], record["response"]) == ("row-1", "succeeded", "ok")
