"""Structured output validated at merge time: parsed columns, and invalid_output instead of a crash."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_batch_provider.results.merge import ChunkResults, join_results
from airflow_batch_provider.results.structured import OutputValidator

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["toys", "books"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["label", "confidence"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ('{"label": "toys", "confidence": 0.9}', None),
        ('{"label": "toys", "confidence": 0.9, "tags": ["a"]}', None),
        ('{"label": "cars", "confidence": 0.9}', "label"),
        ('{"label": "toys"}', "confidence"),
        ('{"label": "toys", "confidence": 7}', "confidence"),
        ("toys", "not valid JSON"),
        ("", "empty"),
        (None, "empty"),
    ],
    ids=["valid", "valid-array", "bad-enum", "missing-field", "out-of-range", "not-json", "empty", "none"],
)
def test_parse(answer, reason):
    values, error = OutputValidator(SCHEMA).parse(answer)
    if reason is None:
        assert error is None and values["label"] == "toys" and values["confidence"] == 0.9
    else:
        assert values is None and reason in error


def test_clashing_field_names_get_a_prefix():
    validator = OutputValidator(SCHEMA, reserved={"label"})
    assert validator.columns["label"][0] == "output_label"
    assert validator.columns["confidence"][0] == "confidence"


def _rec(cid: str, status: str, response):
    return {
        "custom_id": cid, "status": status, "response": response, "finish_reason": "stop", "error": None,
        "error_code": None, "http_status": 200, "input_tokens": 3, "output_tokens": 2,
    }  # fmt: skip


def test_join_writes_parsed_columns_and_invalid_output_rows():
    rows = pa.table({"custom_id": ["a", "b", "c", "d"], "title": ["w", "x", "y", "z"]})
    results = {
        "a": _rec("a", "succeeded", '{"label": "books", "confidence": 0.5, "tags": ["x", "y"]}'),
        "b": _rec("b", "succeeded", '{"label": "nope", "confidence": 0.5}'),
        "c": {**_rec("c", "errored", None), "error": "HTTP 500"},
    }
    chunk = ChunkResults.from_records(results.values(), "batch_1")
    table, stats = join_results(rows, chunk, "batch_1", "/v1/chat/completions", OutputValidator(SCHEMA))
    out = {r["custom_id"]: r for r in table.to_pylist()}
    assert out["a"]["status"] == "succeeded" and out["a"]["label"] == "books" and out["a"]["confidence"] == 0.5
    assert out["a"]["tags"] == '["x","y"]'  # arrays and objects are kept as JSON text
    assert out["b"]["status"] == "invalid_output" and "label" in out["b"]["error"] and out["b"]["label"] is None
    assert out["c"]["status"] == "errored" and out["c"]["error"] == "HTTP 500"
    assert out["d"]["status"] == "missing"
    assert table.schema.field("confidence").type == pa.float64()
    assert stats.statuses == {"succeeded": 1, "invalid_output": 1, "errored": 1, "missing": 1}
