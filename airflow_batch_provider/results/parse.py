"""Parse result lines in the OpenAI batch output format into :class:`~airflow_batch_provider.descriptors.ResultRecord`.

That format is also what the self-hosted runs (vLLM, an OpenAI-compatible server) and the intake
write, so it lives here rather than in the OpenAI backend; every other provider's parser is its
backend's (``backends/<name>/results.py``), built on :func:`result_record`. Parsers never raise
on a well-formed line with an unexpected body: an unreadable result becomes an ``errored`` record
that says why, so one odd line cannot sink a 50,000-row merge.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import orjson

from airflow_batch_provider.descriptors import ResultRecord, ResultStatus
from airflow_batch_provider.exceptions import ResultsError

# Error codes in OpenAI error-file lines that mean "not processed" rather than "bad request".
_OPENAI_LINE_CODES: dict[str, ResultStatus] = {
    "batch_expired": "expired",
    "batch_cancelled": "canceled",
    "batch_canceled": "canceled",
}


def result_record(custom_id: str, status: ResultStatus, **fields: Any) -> ResultRecord:
    """Return a ResultRecord with every field present (None where ``fields`` does not set it)."""
    return {
        "custom_id": custom_id,
        "status": status,
        "response": fields.get("response"),
        "finish_reason": fields.get("finish_reason"),
        "error": fields.get("error"),
        "error_code": fields.get("error_code"),
        "http_status": fields.get("http_status"),
        "input_tokens": fields.get("input_tokens"),
        "output_tokens": fields.get("output_tokens"),
        "cached_input_tokens": fields.get("cached_input_tokens"),
        "cache_write_tokens": fields.get("cache_write_tokens"),
    }


def decode_embedding(value: Any) -> Any:
    """Return an embedding as a list of floats; ``encoding_format: "base64"`` sends little-endian float32 bytes.

    The openai SDK asks for base64 by default (it is a third of the size), so batch lines may hold either.
    """
    if not isinstance(value, str):
        return value
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ResultsError(f"embedding is a string but not base64 ({exc})") from exc
    if len(raw) % 4:
        raise ResultsError(f"base64 embedding has {len(raw)} bytes, not a whole number of float32 values")
    return np.frombuffer(raw, dtype="<f4").tolist()


def _openai_body_text(body: dict[str, Any]) -> tuple[Any, str | None]:
    """Return (response, finish_reason) from a successful OpenAI response body."""
    obj = body.get("object")
    if obj == "list" and isinstance(body.get("data"), list):  # embeddings
        data = body["data"]
        return (decode_embedding(data[0].get("embedding")) if data else None), None
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        choice = choices[0]
        message = choice.get("message")
        if isinstance(message, dict):
            content = message.get("content")
            if content is None and message.get("tool_calls"):
                content = message["tool_calls"][0].get("function", {}).get("arguments")
            if content is None and message.get("refusal"):
                content = message["refusal"]
            return content, choice.get("finish_reason")
        return choice.get("text"), choice.get("finish_reason")
    if body.get("object") == "response":  # /v1/responses
        texts = [
            part.get("text", "")
            for item in body.get("output", [])
            for part in item.get("content", []) or []
            if part.get("type") == "output_text"
        ]
        return "".join(texts), body.get("status")
    return None, None


def parse_openai_line(line: bytes | str) -> ResultRecord:
    """Parse one line of an OpenAI batch output or error file."""
    try:
        obj = orjson.loads(line)
        custom_id = obj["custom_id"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ResultsError(f"Unreadable OpenAI result line ({exc}): {str(line)[:200]!r}") from exc
    error = obj.get("error")
    response = obj.get("response")
    if error:
        if not isinstance(error, dict):  # a bare message instead of {"code", "message"}
            return result_record(custom_id, "errored", error=str(error))
        code = error.get("code")
        status = _OPENAI_LINE_CODES.get(code or "", "errored")
        return result_record(custom_id, status, error=error.get("message") or code, error_code=code)
    if not isinstance(response, dict):
        return result_record(custom_id, "errored", error="result line has neither response nor error")
    status_code = response.get("status_code")
    body = response.get("body") or {}
    if status_code != 200:
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        return result_record(
            custom_id,
            "errored",
            error=err.get("message") or f"HTTP {status_code}",
            error_code=err.get("code") or err.get("type"),
            http_status=status_code,
        )
    usage = body.get("usage") or {}
    try:
        text, finish_reason = _openai_body_text(body)
    except ResultsError as exc:
        raise ResultsError(f"result for custom_id {custom_id!r}: {exc}") from exc
    return result_record(
        custom_id,
        "succeeded",
        response=text,
        finish_reason=finish_reason,
        http_status=200,
        input_tokens=usage.get("prompt_tokens", usage.get("input_tokens")),
        output_tokens=usage.get("completion_tokens", usage.get("output_tokens", 0)),
        cached_input_tokens=_cached_tokens(usage),
    )


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    """Return the prompt tokens OpenAI read from its cache (chat: prompt_tokens_details, Responses: input_...)."""
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    return details.get("cached_tokens") if isinstance(details, dict) else None
