"""Anthropic Message Batches results (``{custom_id, result: {type, message | error}}``) as ResultRecords."""

from __future__ import annotations

from typing import Any

import orjson

from airflow_batch_provider.descriptors import ResultRecord, ResultStatus
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.results.parse import result_record

_ANTHROPIC_TYPES: dict[str, ResultStatus] = {
    "succeeded": "succeeded",
    "errored": "errored",
    "canceled": "canceled",
    "expired": "expired",
}
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def parse_anthropic_result(obj: dict[str, Any]) -> ResultRecord:
    """Parse one Anthropic Message Batches result (already decoded from its JSONL line)."""
    try:
        custom_id = obj["custom_id"]
        result = obj["result"]
        kind = result["type"]
    except (KeyError, TypeError) as exc:
        raise ResultsError(f"Unreadable Anthropic result ({exc}): {str(obj)[:200]!r}") from exc
    status = _ANTHROPIC_TYPES.get(kind)
    if status is None:
        raise ResultsError(f"Anthropic result for {custom_id!r} has unknown type {kind!r}")
    if status != "succeeded":
        error = result.get("error") or {}
        inner = error.get("error") if isinstance(error.get("error"), dict) else error
        message = inner.get("message") if isinstance(inner, dict) else None
        code = inner.get("type") if isinstance(inner, dict) else None
        return result_record(custom_id, status, error=message or f"request {kind}", error_code=code or kind)
    message_obj = result.get("message") or {}
    text_parts: list[str] = []
    response: Any = None
    for block in message_obj.get("content") or []:
        if block.get("type") == "text":
            text_parts.append(block.get("text", ""))
        elif block.get("type") == "tool_use" and response is None:
            response = orjson.dumps(block.get("input")).decode()  # structured output: the tool's input
    if response is None:
        response = "".join(text_parts)
    usage = message_obj.get("usage") or {}
    stop = message_obj.get("stop_reason")
    cache_read, cache_write = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
    input_tokens = usage.get("input_tokens")
    if isinstance(input_tokens, int):  # Anthropic counts cached tokens apart; ResultRecord's total includes them
        input_tokens += (cache_read or 0) + (cache_write or 0)
    return result_record(
        custom_id,
        "succeeded",
        response=response,
        finish_reason=STOP_REASONS.get(stop or "", stop),
        input_tokens=input_tokens,
        output_tokens=usage.get("output_tokens"),
        cached_input_tokens=cache_read,
        cache_write_tokens=cache_write,
    )
