"""Gemini request rendering: the line format, parameter translation and checks, structured output, token parts."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest

from airflow_batch_provider.chunking.arrow_text import json_escape
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.tokens import count_request_tokens
from airflow_batch_provider.exceptions import InvalidInputError
from tests.backends.gemini.conftest import MODEL, SCHEMA


def _spec(**kwargs) -> RequestSpec:
    return RequestSpec(**{"provider": "gemini", "model": MODEL, **kwargs})


def test_structured_output_goes_to_response_json_schema():
    spec = _spec(system_prompt="Be brief.", params={"max_tokens": 64, "temperature": 0}, response_schema=SCHEMA)
    line = renderer_for(spec).request_dict("p-1", "a red toy car")
    assert list(line) == ["custom_id", "request"]
    assert line["custom_id"] == "p-1"
    request = line["request"]
    assert request["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert request["contents"] == [{"role": "user", "parts": [{"text": "a red toy car"}]}]
    assert request["generationConfig"] == {
        "maxOutputTokens": 64,
        "temperature": 0,
        "responseMimeType": "application/json",
        "responseJsonSchema": SCHEMA,
    }


def test_openapi_response_schema_passes_through_params():
    openapi = {"type": "OBJECT", "properties": {"label": {"type": "STRING"}}}
    spec = _spec(params={"responseMimeType": "application/json", "responseSchema": openapi, "stop": "END"})
    config = renderer_for(spec).request_dict("p", "x")["request"]["generationConfig"]
    assert config == {"responseMimeType": "application/json", "responseSchema": openapi, "stopSequences": ["END"]}


def test_rendered_lines_match_request_dict_byte_for_byte():
    spec = _spec(system_prompt="S", params={"max_tokens": 8, "safetySettings": []}, response_schema=SCHEMA)
    renderer = renderer_for(spec)
    ids, texts = ["a", 'b"q'], ["plain", "line\nbreak ü"]
    bodies = json_escape(pa.array(texts, pa.string()))
    bodies = pa.array(['"' + body + '"' + renderer.body_suffix for body in bodies.to_pylist()], pa.large_string())
    lines = renderer.lines_of(pa.array(ids, pa.string()), bodies).to_pylist()
    assert lines == [orjson.dumps(renderer.request_dict(i, t)).decode() + "\n" for i, t in zip(ids, texts)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": {"contents": []}}, "writes these itself"),
        ({"params": {"logit_bias": {}}}, "does not take the parameter"),
        ({"params": {"max_tokens": 8, "maxOutputTokens": 9}}, "both set 'maxOutputTokens'"),
        ({"params": {"max_tokens": 0}}, "positive integer"),
        ({"params": {"responseMimeType": "application/json"}, "response_schema": SCHEMA}, "sets responseMimeType"),
        ({"model": "gpt-4o-mini"}, "not a Gemini model"),
        ({"endpoint": "/v1/chat/completions"}, "not supported for provider 'gemini'"),
    ],
)
def test_bad_params_are_refused_before_anything_is_written(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        _spec(**kwargs)


def test_token_count_reads_gemini_lines():
    spec = _spec(system_prompt="abcd" * 10, params={"max_tokens": 50}, response_schema=SCHEMA)
    line = orjson.dumps(renderer_for(spec).request_dict("k", "efgh" * 25))
    tally = count_request_tokens([line], MODEL)
    schema_chars = len(orjson.dumps(SCHEMA))
    assert tally.input_tokens == 10 + 25 + -(-schema_chars // 4)  # chars/4 per piece, rounded up
    assert tally.output_tokens == 50
    assert 0 < tally.expected_output_tokens < 50  # the schema bounds the answer


def test_gemini_batch_prices_are_half_the_list_price():
    from airflow_batch_provider.cost.pricing import load_pricing

    price = load_pricing(use_settings=False).lookup("gemini-2.5-flash")
    assert (price.provider, price.input_per_mtok, price.output_per_mtok) == ("gemini", 0.30, 2.50)
    assert (price.batch_input_per_mtok, price.batch_output_per_mtok) == pytest.approx((0.15, 1.25))
    assert price.cost(1_000_000, 100_000) == pytest.approx(0.15 + 0.125)
