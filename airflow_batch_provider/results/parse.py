"""Parse provider result lines into :class:`~airflow_batch_provider.descriptors.ResultRecord`.

One function per provider line format. They never raise on a well-formed line with an
unexpected body: an unreadable result becomes an ``errored`` record that says why, so one
odd line cannot sink a 50,000-row merge.
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


def _record(custom_id: str, status: ResultStatus, **fields: Any) -> ResultRecord:
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
            return _record(custom_id, "errored", error=str(error))
        code = error.get("code")
        status = _OPENAI_LINE_CODES.get(code or "", "errored")
        return _record(custom_id, status, error=error.get("message") or code, error_code=code)
    if not isinstance(response, dict):
        return _record(custom_id, "errored", error="result line has neither response nor error")
    status_code = response.get("status_code")
    body = response.get("body") or {}
    if status_code != 200:
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        return _record(
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
    return _record(
        custom_id,
        "succeeded",
        response=text,
        finish_reason=finish_reason,
        http_status=200,
        input_tokens=usage.get("prompt_tokens", usage.get("input_tokens")),
        output_tokens=usage.get("completion_tokens", usage.get("output_tokens", 0)),
    )


_ANTHROPIC_TYPES: dict[str, ResultStatus] = {
    "succeeded": "succeeded",
    "errored": "errored",
    "canceled": "canceled",
    "expired": "expired",
}
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


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
        return _record(custom_id, status, error=message or f"request {kind}", error_code=code or kind)
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
    return _record(
        custom_id,
        "succeeded",
        response=response,
        finish_reason=_STOP_REASONS.get(stop or "", stop),
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
    )


_NOVA_STOP_REASONS = {**_STOP_REASONS, "content_filtered": "content_filter"}


def _bedrock_output(output: dict[str, Any]) -> tuple[Any, str | None, Any, Any]:
    """Return (response, finish_reason, input tokens, output tokens) of a Bedrock ``modelOutput``.

    Anthropic models answer a Messages body (``content``, ``stop_reason``, ``usage.input_tokens``);
    Amazon Nova answers ``output.message.content`` with ``stopReason`` and ``usage.inputTokens``.
    A forced tool call (structured output) answers with the tool's input, as JSON text.
    """
    if isinstance(output.get("output"), dict):  # Amazon Nova
        blocks = (output["output"].get("message") or {}).get("content") or []
        usage = output.get("usage") or {}
        stop = output.get("stopReason")
        tool = next((b["toolUse"] for b in blocks if isinstance(b, dict) and isinstance(b.get("toolUse"), dict)), None)
        if tool is not None:
            response: Any = orjson.dumps(tool.get("input")).decode()
        else:
            response = "".join(b.get("text", "") for b in blocks if isinstance(b, dict))
        return response, _NOVA_STOP_REASONS.get(stop or "", stop), usage.get("inputTokens"), usage.get("outputTokens")
    message = parse_anthropic_result({"custom_id": "-", "result": {"type": "succeeded", "message": output}})
    return message["response"], message["finish_reason"], message["input_tokens"], message["output_tokens"]


def parse_bedrock_record(line: bytes | str) -> ResultRecord:
    """Parse one line of a Bedrock batch output file (``{recordId, modelInput, modelOutput | error}``).

    ``error.errorCode`` is an HTTP-style status (429 and 5xx are worth a retry, 400 is not).
    """
    try:
        obj = orjson.loads(line)
        custom_id = obj["recordId"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ResultsError(f"Unreadable Bedrock result line ({exc}): {str(line)[:200]!r}") from exc
    error = obj.get("error")
    if error is not None:
        if not isinstance(error, dict):
            return _record(custom_id, "errored", error=str(error))
        code = error.get("errorCode")
        status_code = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
        return _record(
            custom_id,
            "errored",
            error=error.get("errorMessage") or f"error {code}",
            error_code=None if code is None else str(code),
            http_status=status_code,
        )
    output = obj.get("modelOutput")
    if not isinstance(output, dict):
        return _record(custom_id, "errored", error="result line has neither modelOutput nor error")
    response, finish_reason, input_tokens, output_tokens = _bedrock_output(output)
    return _record(
        custom_id,
        "succeeded",
        response=response,
        finish_reason=finish_reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
