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


def test_repeated_answers_get_the_same_verdict_and_the_memo_stays_bounded(monkeypatch):
    """Each distinct answer text is validated once and remembered, up to MEMO_SIZE texts of up to
    MEMO_MAX_CHARS; past either, answers are still validated (correctly), just not remembered."""
    from airflow_batch_provider.results import structured

    monkeypatch.setattr(structured, "MEMO_SIZE", 3)
    validator = OutputValidator(SCHEMA)
    answers = [f'{{"label": "toys", "confidence": 0.{i}}}' for i in range(1, 6)] + [
        '{"label": "cars", "confidence": 1}'
    ]
    first = [validator.parse(a) for a in answers]
    again = [validator.parse(a) for a in answers]
    assert again == first
    assert [error is None for _, error in first] == [True] * 5 + [False]
    assert [values["confidence"] for values, _ in first[:5]] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert len(validator._memo) == 3
    long_answer = '{"label": "toys", "confidence": 0.5, "tags": ["%s"]}' % ("x" * structured.MEMO_MAX_CHARS)
    validator._memo.clear()
    assert validator.parse(long_answer)[1] is None and not validator._memo  # validated, not remembered
