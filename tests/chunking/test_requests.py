"""RequestSpec validation and the per-provider renderers' wire format."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pyarrow as pa
import pydantic
import pytest

from airflow_batch_provider.backends.anthropic.requests import AnthropicRenderer
from airflow_batch_provider.backends.openai.requests import OpenAIRenderer
from airflow_batch_provider.chunking.arrow_text import json_strings
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for, strict_json_schema
from airflow_batch_provider.exceptions import InvalidInputError
from tests.chunking.reference import fingerprint, render, render_arrays, render_many, request_fingerprint

TRICKY_TEXTS = [
    "plain",
    'quotes " and \\ backslash \\n (not a newline)',
    "line one\nline two\r\n\ttabbed",
    "unicode: é ñ 中文 日本語 😀 \u2028 \u2029",
    "controls \x00 \x01 \x1f \x7f",
    "</script><!-- {braces} [brackets]",
    "",
    "x" * 10_000,
]


class Label(pydantic.BaseModel):
    """Product label."""

    label: str
    confidence: float | None = None


SCHEMA = {
    "title": "Sentiment answer",
    "type": "object",
    "properties": {"sentiment": {"type": "string", "enum": ["pos", "neg"]}},
    "required": ["sentiment"],
    "additionalProperties": False,
}

SPECS = {
    "openai-chat": RequestSpec(provider="openai", model="gpt-4o-mini"),
    "openai-chat-system-params": RequestSpec(
        provider="openai",
        model="gpt-4o-mini",
        system_prompt='You are "careful".\nAnswer briefly.',
        params={"max_tokens": 5, "temperature": 0, "stop": ["\n"], "seed": 7},
    ),
    "openai-chat-schema": RequestSpec(provider="openai", model="gpt-4o-mini", response_schema=SCHEMA),
    "openai-chat-pydantic": RequestSpec(provider="openai", model="gpt-4o-mini", response_schema=Label),
    "openai-embeddings": RequestSpec(
        provider="openai", model="text-embedding-3-small", endpoint="/v1/embeddings", params={"dimensions": 256}
    ),
    "openai-completions": RequestSpec(
        provider="openai", model="gpt-3.5-turbo-instruct", endpoint="/v1/completions", params={"max_tokens": 3}
    ),
    "anthropic": RequestSpec(provider="anthropic", model="claude-haiku-4-5", params={"max_tokens": 64}),
    "anthropic-system-stop": RequestSpec(
        provider="anthropic",
        model="claude-haiku-4-5",
        system_prompt="Be terse. 中文 ok",
        params={"max_tokens": 64, "temperature": 0.2, "top_p": 0.9, "stop": "END", "top_k": 5},
    ),
    "anthropic-schema": RequestSpec(
        provider="anthropic", model="claude-haiku-4-5", params={"max_tokens": 64}, response_schema=Label
    ),
}


def _expected_line(spec: RequestSpec, custom_id: str, text: str) -> dict[str, Any]:
    """Write out the wire format by hand, independently of the renderers' request_dict."""
    params = dict(spec.params)
    if spec.provider == "openai":
        if spec.endpoint == "/v1/embeddings":
            body: dict[str, Any] = {"model": spec.model, "input": text, **params}
        elif spec.endpoint == "/v1/completions":
            body = {"model": spec.model, "prompt": text, **params}
        else:
            system = [{"role": "system", "content": spec.system_prompt}] if spec.system_prompt else []
            body = {"model": spec.model, "messages": [*system, {"role": "user", "content": text}], **params}
        if spec.json_schema is not None:
            schema = strict_json_schema(spec.json_schema) if spec.schema_from_model else spec.json_schema
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": spec.schema_name, "schema": schema, "strict": True},
            }
        return {"custom_id": custom_id, "method": "POST", "url": spec.endpoint, "body": body}
    request: dict[str, Any] = {"model": spec.model, "max_tokens": params.pop("max_tokens")}
    if spec.system_prompt:
        request["system"] = spec.system_prompt
    request["messages"] = [{"role": "user", "content": text}]
    if "stop" in params:
        stop = params.pop("stop")
        params["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    request.update(params)
    if spec.json_schema is not None:
        request["tools"] = [
            {
                "name": spec.schema_name,
                "description": request.get("description") or "",
                "input_schema": spec.json_schema,
            }
        ]
        request["tool_choice"] = {"type": "tool", "name": spec.schema_name}
    return {"custom_id": custom_id, "params": request}


@pytest.mark.parametrize("spec_id", list(SPECS))
@pytest.mark.parametrize("text", TRICKY_TEXTS, ids=[f"text{i}" for i in range(len(TRICKY_TEXTS))])
def test_rendered_line_equals_the_full_dict(spec_id: str, text: str) -> None:
    spec = SPECS[spec_id]
    renderer = renderer_for(spec)
    for custom_id in ("row-1", 'id with "quotes" é', "a" * 512):
        line = render(renderer, custom_id, text)
        assert b"\n" not in line and not line.endswith(b"\n")
        parsed = orjson.loads(line)
        assert parsed == renderer.request_dict(custom_id, text)
        assert list(parsed) == list(renderer.request_dict(custom_id, text))  # custom_id first, same key order
        expected = _expected_line(spec, custom_id, text)
        if spec.provider == "anthropic" and spec.json_schema is not None:
            expected["params"]["tools"][0]["description"] = parsed["params"]["tools"][0]["description"]
        assert parsed == expected


@pytest.mark.parametrize("spec_id", list(SPECS))
def test_render_many_matches_render_and_fingerprints(spec_id: str) -> None:
    renderer = renderer_for(SPECS[spec_id])
    ids = [f"id-{i}" for i in range(len(TRICKY_TEXTS))]
    lines, fingerprints = render_many(renderer, ids, TRICKY_TEXTS)
    assert lines == [render(renderer, i, t) for i, t in zip(ids, TRICKY_TEXTS)]
    for custom_id, text, expected in zip(ids, TRICKY_TEXTS, fingerprints):
        without_id = {k: v for k, v in renderer.request_dict(custom_id, text).items() if k != "custom_id"}
        spec = renderer.spec
        assert expected == request_fingerprint(
            orjson.dumps(without_id), provider=spec.provider, endpoint=spec.endpoint or ""
        )
        assert fingerprint(renderer, text) == expected
        assert len(expected) == 32 and int(expected, 16) >= 0


@pytest.mark.parametrize("spec_id", list(SPECS))
def test_render_arrays_is_byte_identical_to_render_many(spec_id: str) -> None:
    """The Arrow path gives the same lines (plus newlines, in one buffer) and fingerprints as the per-row path."""
    renderer = renderer_for(SPECS[spec_id])
    ids = ["row-1", 'id with "quotes" \\ é', "\x00nul", "a" * 512, "😀", "tab\tid", "", "z"]
    rendered = render_arrays(renderer, pa.array(ids), json_strings(pa.array(TRICKY_TEXTS)))
    lines, fingerprints = render_many(renderer, ids, TRICKY_TEXTS)
    assert rendered.data(0, len(ids)).tobytes() == b"".join(line + b"\n" for line in lines)
    assert rendered.data(2, 5).tobytes() == b"".join(line + b"\n" for line in lines[2:5])
    assert rendered.sizes.tolist() == [len(line) + 1 for line in lines]
    assert rendered.fingerprints.to_pylist() == fingerprints


def test_render_arrays_handles_sliced_and_empty_batches() -> None:
    renderer = renderer_for(SPECS["openai-chat"])
    ids, texts = pa.array(["skip", "a", "b", "skip"]), pa.array(["x", 'say "hi"', "ok\n", "y"])
    sliced = render_arrays(renderer, ids.slice(1, 2), json_strings(texts.slice(1, 2)))
    lines, fingerprints = render_many(renderer, ["a", "b"], ['say "hi"', "ok\n"])
    assert sliced.data(0, 2).tobytes() == b"".join(line + b"\n" for line in lines)
    assert sliced.fingerprints.to_pylist() == fingerprints
    empty = render_arrays(renderer, pa.array([], pa.string()), json_strings(pa.array([], pa.string())))
    assert len(empty) == 0 and empty.data(0, 0).tobytes() == b""
    with pytest.raises(ValueError, match="2 custom ids but 1 texts"):
        render_arrays(renderer, pa.array(["a", "b"]), json_strings(pa.array(["x"])))


def test_fingerprint_ignores_the_id_but_not_the_request() -> None:
    chat = renderer_for(SPECS["openai-chat"])
    _, same = render_many(chat, ["a", "b"], ["hello", "hello"])
    assert same[0] == same[1]
    assert fingerprint(chat, "hello") != fingerprint(chat, "hello!")
    other_model = renderer_for(RequestSpec(provider="openai", model="gpt-4o"))
    assert fingerprint(other_model, "hello") != fingerprint(chat, "hello")
    other_params = renderer_for(RequestSpec(provider="openai", model="gpt-4o-mini", params={"temperature": 0}))
    assert fingerprint(other_params, "hello") != fingerprint(chat, "hello")
    expected = hashlib.sha256(
        b"openai\n/v1/chat/completions\n"
        + orjson.dumps(
            {
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]},
            }
        )
    ).hexdigest()[:32]
    assert fingerprint(chat, "hello") == expected


def test_openai_structured_output_from_pydantic_is_strict() -> None:
    body = orjson.loads(render(renderer_for(SPECS["openai-chat-pydantic"]), "x", "t"))["body"]
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Label"
    assert fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["label", "confidence"]  # strict mode: all required, optional ones nullable
    assert "default" not in schema["properties"]["confidence"]


def test_openai_structured_output_from_dict_is_passed_as_given() -> None:
    body = orjson.loads(render(renderer_for(SPECS["openai-chat-schema"]), "x", "t"))["body"]
    assert body["response_format"]["json_schema"] == {"name": "Sentiment_answer", "schema": SCHEMA, "strict": True}


def test_anthropic_structured_output_is_a_forced_tool() -> None:
    params = orjson.loads(render(renderer_for(SPECS["anthropic-schema"]), "x", "t"))["params"]
    assert params["tool_choice"] == {"type": "tool", "name": "Label"}
    (tool,) = params["tools"]
    assert tool["name"] == "Label"
    assert tool["input_schema"] == Label.model_json_schema()
    assert tool["description"] == "Product label."


def test_anthropic_system_prompt_is_top_level_and_stop_becomes_stop_sequences() -> None:
    params = orjson.loads(render(renderer_for(SPECS["anthropic-system-stop"]), "x", "hi"))["params"]
    assert params["system"] == "Be terse. 中文 ok"
    assert params["messages"] == [{"role": "user", "content": "hi"}]
    assert params["stop_sequences"] == ["END"]
    assert "stop" not in params


def test_spec_params_are_copied() -> None:
    params: dict[str, Any] = {"max_tokens": 5, "stop": ["a"]}
    spec = RequestSpec(provider="openai", model="m", params=params)
    params["stop"].append("b")
    assert spec.params == {"max_tokens": 5, "stop": ["a"]}


def test_default_endpoints() -> None:
    assert RequestSpec(provider="openai", model="m").endpoint == "/v1/chat/completions"
    assert RequestSpec(provider="anthropic", model="m", params={"max_tokens": 1}).endpoint == "/v1/messages"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"provider": "mistral"}, ["'mistral'", "anthropic", "openai"], id="unknown-provider"),
        pytest.param(
            {"endpoint": "/v1/messages"},
            ["/v1/messages", "/v1/chat/completions", "/v1/embeddings"],
            id="openai-bad-endpoint",
        ),
        pytest.param(
            {"provider": "anthropic", "endpoint": "/v1/chat/completions", "params": {"max_tokens": 5}},
            ["/v1/chat/completions", "accepted: /v1/messages"],
            id="anthropic-bad-endpoint",
        ),
        pytest.param(
            {"endpoint": "/v1/embeddings", "system_prompt": "s"},
            ["/v1/embeddings", "system prompt"],
            id="embeddings-system",
        ),
        pytest.param(
            {"endpoint": "/v1/embeddings", "response_schema": SCHEMA},
            ["/v1/embeddings", "response_schema"],
            id="embeddings-schema",
        ),
        pytest.param(
            {"endpoint": "/v1/completions", "system_prompt": "s"},
            ["/v1/completions", "system prompt"],
            id="completions-system",
        ),
        pytest.param({"provider": "anthropic"}, ["max_tokens"], id="anthropic-no-max-tokens"),
        pytest.param(
            {"provider": "anthropic", "params": {"max_tokens": 0}}, ["max_tokens", "0"], id="anthropic-zero-max-tokens"
        ),
        pytest.param({"provider": "anthropic", "params": {"max_tokens": 5, "seed": 1}}, ["seed"], id="anthropic-seed"),
        pytest.param(
            {"provider": "anthropic", "params": {"max_tokens": 5, "stop": "a", "stop_sequences": ["b"]}},
            ["stop", "stop_sequences"],
            id="anthropic-two-stops",
        ),
        pytest.param(
            {"provider": "anthropic", "params": {"max_tokens": 5, "system": "s"}},
            ["system_prompt"],
            id="anthropic-system-param",
        ),
        pytest.param({"params": {"messages": []}}, ["messages"], id="openai-reserved-param"),
        pytest.param(
            {"params": {"response_format": {"type": "json_object"}}, "response_schema": SCHEMA},
            ["response_format", "response_schema"],
            id="schema-and-response-format",
        ),
        pytest.param({"params": {"when": object()}}, ["params['when']", "JSON"], id="param-not-json"),
        pytest.param(
            {"response_schema": {"type": "array", "items": {}}}, ["'array'", "object"], id="schema-not-object"
        ),
        pytest.param(
            {"response_schema": {"type": "object", "properties": 3}}, ["not a valid JSON Schema"], id="schema-invalid"
        ),
        pytest.param({"response_schema": int}, ["pydantic"], id="schema-wrong-class"),
        pytest.param({"model": ""}, ["model"], id="empty-model"),
    ],
)
def test_invalid_specs_are_rejected(kwargs: dict[str, Any], expected: list[str]) -> None:
    arguments = {"provider": "openai", "model": "gpt-4o-mini", **kwargs}
    with pytest.raises(InvalidInputError) as info:
        RequestSpec(**arguments)
    for fragment in expected:
        assert fragment in str(info.value)


def test_renderer_classes_check_the_provider() -> None:
    assert isinstance(renderer_for(SPECS["openai-chat"]), OpenAIRenderer)
    assert isinstance(renderer_for(SPECS["anthropic"]), AnthropicRenderer)
    with pytest.raises(InvalidInputError, match="anthropic"):
        OpenAIRenderer(SPECS["anthropic"])


@pytest.mark.parametrize(
    ("provider", "endpoint", "model"),
    [
        ("openai", "/v1/chat/completions", "ft:gpt-4o-mini-2024-07-18:acme::abc123"),
        ("openai", "/v1/chat/completions", "meta-llama/Llama-3.1-8B-Instruct"),
        ("openai", "/v1/chat/completions", "o3-mini"),
        ("openai", "/v1/completions", "gpt-3.5-turbo-instruct"),
        ("openai", "/v1/embeddings", "text-embedding-3-large"),
        ("openai", "/v1/embeddings", "nomic-embed-text"),
        ("openai", "/v1/embeddings", "Qwen/Qwen3-Embedding-0.6B"),
        ("openai", "/v1/embeddings", "e5"),  # an unknown name: a self-hosted model may be anything
        ("openai", "/v1/embeddings", "openai/gpt-oss-20b"),  # not a known family name at the start
        ("anthropic", "/v1/messages", "claude-haiku-4-5"),
    ],
)
def test_models_that_may_serve_the_endpoint_are_accepted(provider: str, endpoint: str, model: str) -> None:
    params = {"max_tokens": 5} if provider == "anthropic" else {}
    assert RequestSpec(provider=provider, endpoint=endpoint, model=model, params=params).model == model


@pytest.mark.parametrize(
    ("provider", "endpoint", "model", "expected"),
    [
        ("openai", "/v1/chat/completions", "text-embedding-3-small", "is an embedding model"),
        ("openai", "/v1/completions", "text-embedding-ada-002", "is an embedding model"),
        ("anthropic", "/v1/messages", "voyage-embed-1", "is an embedding model"),
        ("openai", "/v1/embeddings", "gpt-4o-mini", "is a chat model"),
        ("openai", "/v1/embeddings", "ft:gpt-4o-mini:acme::abc123", "is a chat model"),
        ("openai", "/v1/embeddings", "o1", "is a chat model"),
        ("openai", "/v1/embeddings", "O4-mini", "is a chat model"),
        ("openai", "/v1/embeddings", "chatgpt-4o-latest", "is a chat model"),
        ("openai", "/v1/embeddings", "claude-haiku-4-5", "is a chat model"),
    ],
)
def test_models_that_cannot_serve_the_endpoint_are_rejected(
    provider: str, endpoint: str, model: str, expected: str
) -> None:
    params = {"max_tokens": 5} if provider == "anthropic" else {}
    with pytest.raises(InvalidInputError, match=f"Model '{model}' {expected}.* Use "):
        RequestSpec(provider=provider, endpoint=endpoint, model=model, params=params)
