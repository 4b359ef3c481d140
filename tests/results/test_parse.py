"""Parsing OpenAI batch output and error lines."""

from __future__ import annotations

import orjson
import pytest

from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.results.parse import parse_openai_line


def _ok(body: dict) -> bytes:
    return orjson.dumps({"id": "r", "custom_id": "c1", "response": {"status_code": 200, "body": body}, "error": None})


CASES = [
    (
        _ok(
            {
                "choices": [{"message": {"content": "toys"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 1},
            }
        ),
        {"status": "succeeded", "response": "toys", "finish_reason": "stop", "input_tokens": 9, "output_tokens": 1},
    ),
    (
        _ok({"object": "list", "data": [{"embedding": [0.5, 0.25]}], "usage": {"prompt_tokens": 4}}),
        {"status": "succeeded", "response": [0.5, 0.25], "input_tokens": 4, "output_tokens": 0},
    ),
    (
        orjson.dumps(
            {
                "custom_id": "c1",
                "response": {
                    "status_code": 400,
                    "body": {"error": {"message": "bad model", "code": "model_not_found"}},
                },
                "error": None,
            }
        ),
        {"status": "errored", "error": "bad model", "error_code": "model_not_found", "http_status": 400},
    ),
    (
        orjson.dumps({"custom_id": "c1", "response": None, "error": {"code": "batch_expired", "message": "expired"}}),
        {"status": "expired", "error_code": "batch_expired"},
    ),
    (
        orjson.dumps(
            {"custom_id": "c1", "response": None, "error": {"code": "batch_cancelled", "message": "cancelled"}}
        ),
        {"status": "canceled"},
    ),
    (
        _ok({"choices": [{"message": {"content": None, "refusal": "I can't"}, "finish_reason": "stop"}], "usage": {}}),
        {"status": "succeeded", "response": "I can't"},
    ),
]


@pytest.mark.parametrize(
    ("line", "expected"), CASES, ids=["chat", "embedding", "http-400", "expired", "cancelled", "refusal"]
)
def test_parse_openai_line(line, expected):
    record = parse_openai_line(line)
    assert record["custom_id"] == "c1"
    for key, value in expected.items():
        assert record[key] == value, key


@pytest.mark.parametrize("line", [b"not json", b'{"no_custom_id": 1}', b"[]"], ids=["garbage", "no-id", "array"])
def test_unreadable_line_raises_with_the_line(line):
    with pytest.raises(ResultsError, match="Unreadable"):
        parse_openai_line(line)
