"""OpenAICompatibleHook: connection handling, and single calls / whole runs against the emulator."""

from __future__ import annotations

import asyncio
import json

import openai
import orjson
import pytest

from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.hooks.openai_compatible import (
    PLACEHOLDER_API_KEY,
    OpenAICompatibleHook,
    ServerRequest,
    normalise_base_url,
)
from airflow_batch_provider.utils.retry import RetryPolicy

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


def _conn(monkeypatch, conn_id: str = "openai_compatible_default", **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "openai_compatible", **fields}))


@pytest.mark.parametrize(
    ("raw", "port", "expected"),
    [
        ("http://gpu-box:8000/v1", None, "http://gpu-box:8000/v1"),
        ("http://gpu-box:8000/v1/", None, "http://gpu-box:8000/v1"),
        ("gpu-box:8000", None, "http://gpu-box:8000/v1"),
        ("gpu-box", 8000, "http://gpu-box:8000/v1"),
        ("http://gpu-box:9000", 8000, "http://gpu-box:9000/v1"),
        ("https://llm.example.com/api/v1", None, "https://llm.example.com/api/v1"),
    ],
    ids=["full", "trailing_slash", "no_scheme", "port_field", "url_port_wins", "custom_path"],
)
def test_base_url_normalisation(raw, port, expected):
    assert normalise_base_url(raw, port) == expected


def test_missing_base_url_names_the_fields(monkeypatch):
    _conn(monkeypatch)
    with pytest.raises(openai.OpenAIError, match="host field or the base_url extra"):
        _ = OpenAICompatibleHook().client_kwargs


def test_connection_fields(monkeypatch):
    _conn(monkeypatch, host="ignored-host", extra={"base_url": "http://10.0.0.5:8000/v1", "timeout": 30,
          "headers": {"X-Team": "ml"}})  # fmt: skip
    kwargs = OpenAICompatibleHook().client_kwargs
    assert kwargs["base_url"] == "http://10.0.0.5:8000/v1"
    assert kwargs["api_key"] == PLACEHOLDER_API_KEY  # vLLM without --api-key: the SDK still needs a value
    assert kwargs["timeout"] == 30.0 and kwargs["default_headers"] == {"X-Team": "ml"}
    _conn(monkeypatch, "with_text_headers", host="h", extra={"headers": '{"X-A": "1"}'})
    assert OpenAICompatibleHook("with_text_headers").client_kwargs["default_headers"] == {"X-A": "1"}
    _conn(monkeypatch, "my_vllm", host="vllm.internal", port=8000, password="token-abc123")
    hook = OpenAICompatibleHook("my_vllm")
    assert hook.base_url == "http://vllm.internal:8000/v1"
    assert hook.client_kwargs["api_key"] == "token-abc123"
    assert str(hook.get_conn().base_url) == "http://vllm.internal:8000/v1/"


def test_hook_registration_attributes():
    assert OpenAICompatibleHook.conn_type == "openai_compatible"
    assert OpenAICompatibleHook.default_conn_name == "openai_compatible_default"
    assert OpenAICompatibleHook().conn_id == "openai_compatible_default"


def test_acreate_returns_the_body_and_does_not_retry_a_400(batch_emulator, monkeypatch):
    _conn(monkeypatch, host=batch_emulator.openai_base_url)
    hook = OpenAICompatibleHook(retry_policy=FAST)
    good = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}

    async def call(body):
        async with openai.AsyncOpenAI(**hook.client_kwargs) as client:
            return await hook.acreate(client, "/v1/chat/completions", body)

    body = asyncio.run(call(good))
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
    with pytest.raises(ProviderCallError, match="1 attempt") as excinfo:
        asyncio.run(call({"model": "m", "messages": []}))
    assert isinstance(excinfo.value.__cause__, openai.BadRequestError)
    assert batch_emulator.stats()["http"]["requests"] == 2


def test_run_writes_one_line_per_request(batch_emulator, monkeypatch):
    _conn(monkeypatch, host=batch_emulator.openai_base_url)
    requests = [
        ServerRequest(i, f"c{i}", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
                      f"req_{i}")
        for i in range(20)
    ]  # fmt: skip
    requests.append(ServerRequest(20, "c20", "/v1/completions", {"model": "m", "prompt": "x"}, "req_20"))
    written: list[bytes] = []
    stats = OpenAICompatibleHook(retry_policy=FAST).run(
        requests, fingerprint="f" * 64, write=written.append, max_concurrency=5
    )
    lines = [orjson.loads(w) for w in written]
    assert all(w.endswith(b"\n") for w in written)
    assert sorted(line["custom_id"] for line in lines) == sorted(f"c{i}" for i in range(21))
    assert (stats.counts.total, stats.counts.succeeded, stats.counts.failed) == (21, 20, 1)
    assert stats.max_in_flight <= 5 and stats.input_tokens > 0
    unsupported = next(line for line in lines if line["custom_id"] == "c20")
    assert (
        unsupported["response"]["status_code"] == 400
        and "not supported" in unsupported["response"]["body"]["error"]["message"]
    )
    assert batch_emulator.stats()["realtime"]["requests"] == 20  # the unsupported endpoint was never sent


def test_connection_errors_end_as_error_lines(monkeypatch):
    _conn(monkeypatch, host="http://127.0.0.1:9/v1")  # discard port: nothing listens
    written: list[bytes] = []
    hook = OpenAICompatibleHook(retry_policy=RetryPolicy(attempts=1), max_retries=0, timeout=5)
    request = ServerRequest(0, "c0", "/v1/chat/completions", {"model": "m", "messages": []}, "req_0")
    stats = hook.run([request], fingerprint="f" * 64, write=written.append)
    (line,) = [orjson.loads(w) for w in written]
    assert line["response"] is None and line["error"]["code"] == "connection_error"
    assert stats.counts.failed == 1 and stats.status_codes == {"connection_error": 1}


@pytest.mark.parametrize("value", [0, -3, 1.5], ids=["zero", "negative", "float"])
def test_run_rejects_a_bad_concurrency(value):
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAICompatibleHook().run([], fingerprint="f", write=print, max_concurrency=value)


def test_test_connection_reports_failure_with_the_reason(batch_emulator, monkeypatch):
    _conn(monkeypatch, host=batch_emulator.openai_base_url)
    ok, message = OpenAICompatibleHook().test_connection()  # the emulator serves no /v1/models
    assert ok is False and "404" in message


def test_header_values_are_masked_in_logs(monkeypatch):
    """The UI stores the headers extra as text, which Airflow's masker never looks inside."""
    from airflow.sdk._shared.secrets_masker import redact

    _conn(monkeypatch, host="h", extra={"headers": '{"X-Gateway-Token": "gw-7f3a9c-secret", "X-Team": "ml-platform"}'})
    assert redact("sent X-Gateway-Token: gw-7f3a9c-secret") == "sent X-Gateway-Token: gw-7f3a9c-secret"
    kwargs = OpenAICompatibleHook().client_kwargs
    assert kwargs["default_headers"]["X-Gateway-Token"] == "gw-7f3a9c-secret"  # still sent as it is
    assert redact("sent X-Gateway-Token: gw-7f3a9c-secret") == "sent X-Gateway-Token: ***"
    assert redact("team ml-platform") == "team ***"
