"""Expected output tokens from the response schema: an enum label is a few tokens, not max_tokens."""

from __future__ import annotations

import orjson
import pytest

from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.answers import answer_schema, typical_answer
from airflow_batch_provider.cost.tokens import TokenCounter, count_request_tokens
from tests.chunking.reference import render

LABELS = ["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
CLASSIFICATION = {
    "title": "classification",
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": LABELS},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["label", "confidence"],
    "additionalProperties": False,
}


def test_typical_answer_leans_long_within_what_the_schema_allows() -> None:
    assert typical_answer(CLASSIFICATION) == '{"label":"electronics","confidence":0.93}'
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "bbb"]}},
            "when": {"type": "string", "format": "date"},
            "note": {"type": ["string", "null"], "maxLength": 9},
            "ok": {"type": "boolean"},
            "kind": {"const": "x"},
            "n": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}]},
        },
    }
    answer = orjson.loads(typical_answer(schema) or "null")
    assert answer == {
        "tags": ["bbb", "bbb"],
        "when": "2026-01-31",
        "note": "word word",
        "ok": False,
        "kind": "x",
        "n": "word word wo",
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"summary": {"type": "string"}}},  # free text
        {"type": "array", "items": {"type": "integer"}},  # no maxItems
        {"type": "object", "additionalProperties": {"type": "integer"}},  # open-ended keys
        {"$ref": "#/$defs/x"},
    ],
    ids=["free-text", "open-array", "open-object", "ref"],
)
def test_schemas_that_bound_nothing_give_no_typical_answer(schema) -> None:
    assert typical_answer(schema) is None


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_schema_is_found_in_each_providers_request(provider: str) -> None:
    model = "gpt-4o-mini" if provider == "openai" else "claude-haiku-4-5"
    spec = RequestSpec(provider=provider, model=model, params={"max_tokens": 64}, response_schema=CLASSIFICATION)
    line = orjson.loads(render(renderer_for(spec), "p1", "Classify: a phone"))
    body = line.get("body") or line["params"]
    assert answer_schema(body)["properties"]["label"]["enum"] == LABELS
    assert answer_schema({"tool_choice": {"type": "auto"}, "tools": body.get("tools", [])}) is None


def test_expected_output_tokens_of_a_structured_chunk() -> None:
    """The example DAG's requests: max_tokens=64 is the bound; the answer is ~a dozen tokens."""
    spec = RequestSpec(
        provider="openai", model="gpt-4o-mini", params={"max_tokens": 64}, response_schema=CLASSIFICATION
    )
    renderer = renderer_for(spec)
    lines = [render(renderer, f"p{i}", f"Classify: product {i}") for i in range(100)]
    tally = count_request_tokens(lines, "gpt-4o-mini")
    per_answer = TokenCounter("gpt-4o-mini").count('{"label":"electronics","confidence":0.93}')
    assert 5 < per_answer < 20
    assert (tally.output_tokens, tally.output_basis) == (6_400, "max_tokens")
    assert tally.expected_output_tokens == 100 * per_answer
    assert tally.expected_basis == f"response schema, ~{per_answer} tokens/answer"


def test_the_expectation_never_exceeds_the_bound_and_a_given_one_wins() -> None:
    spec = RequestSpec(provider="openai", model="gpt-4o-mini", params={"max_tokens": 3}, response_schema=CLASSIFICATION)
    line = render(renderer_for(spec), "p1", "Classify: a phone")
    assert count_request_tokens([line], "gpt-4o-mini").expected_output_tokens == 3
    given = count_request_tokens([line], "gpt-4o-mini", expected_output_tokens=2)
    assert (given.expected_output_tokens, given.expected_basis) == (2, "expected_output_tokens=2")


def test_each_schema_in_a_tally_gets_its_own_typical_answer() -> None:
    """Typical answers are worked out once per distinct schema: requests with another schema (here an
    Anthropic forced tool with a shorter enum) must not reuse the first one's answer."""
    short = {**CLASSIFICATION, "properties": {"label": {"type": "string", "enum": ["a", "b"]}}, "required": ["label"]}
    lines = []
    for schema in (CLASSIFICATION, short):
        spec = RequestSpec(
            provider="anthropic", model="claude-haiku-4-5", params={"max_tokens": 64}, response_schema=schema
        )
        lines += [render(renderer_for(spec), f"p{i}", f"Classify: product {i}") for i in range(3)]
    counter = TokenCounter("claude-haiku-4-5")
    tally = count_request_tokens(lines, "claude-haiku-4-5", counter=counter)
    long_answer, short_answer = typical_answer(CLASSIFICATION), typical_answer(short)
    assert short_answer == '{"label":"a"}'
    assert tally.expected_output_tokens == 3 * counter.count(long_answer or "") + 3 * counter.count(short_answer)
