"""Bedrock output records (``.jsonl.out``) into the merged schema."""

from __future__ import annotations

import orjson
import pytest

from airflow_batch_provider.backends.bedrock.results import parse_bedrock_record
from airflow_batch_provider.batches.line_retry import is_retryable
from airflow_batch_provider.exceptions import ResultsError


def _line(**fields) -> bytes:
    return orjson.dumps({"recordId": "r1", "modelInput": {"messages": []}, **fields})


def test_anthropic_message_with_a_tool_call():
    output = {
        "content": [{"type": "tool_use", "id": "t", "name": "c", "input": {"label": "toys"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }
    record = parse_bedrock_record(_line(modelOutput=output))
    assert (record["custom_id"], record["status"], orjson.loads(record["response"])) == (
        "r1",
        "succeeded",
        {"label": "toys"},
    )
    assert (record["finish_reason"], record["input_tokens"], record["output_tokens"]) == ("tool_calls", 12, 5)


def test_nova_text_and_tool_use():
    text = {
        "output": {"message": {"content": [{"text": "hi"}]}},
        "stopReason": "max_tokens",
        "usage": {"inputTokens": 3, "outputTokens": 1},
    }
    record = parse_bedrock_record(_line(modelOutput=text))
    assert (record["response"], record["finish_reason"], record["input_tokens"]) == ("hi", "length", 3)
    tool = {
        "output": {"message": {"content": [{"toolUse": {"name": "a", "input": {"x": 1}}}]}},
        "stopReason": "tool_use",
    }
    assert parse_bedrock_record(_line(modelOutput=tool))["response"] == '{"x":1}'


@pytest.mark.parametrize(("code", "retryable"), [(500, True), (429, True), (400, False), ("503", True)])
def test_error_records_keep_the_code(code, retryable):
    record = parse_bedrock_record(_line(error={"errorCode": code, "errorMessage": "boom"}))
    assert record["status"] == "errored" and record["error"] == "boom"
    assert record["http_status"] == int(code) and is_retryable(record) is retryable


def test_unreadable_lines_name_the_problem():
    with pytest.raises(ResultsError, match="Unreadable Bedrock result line"):
        parse_bedrock_record(b'{"modelOutput": {}}')
    assert parse_bedrock_record(_line())["status"] == "errored"
