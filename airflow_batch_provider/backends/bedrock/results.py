"""Amazon Bedrock batch output lines (``{recordId, modelInput, modelOutput | error}``) as ResultRecords."""

from __future__ import annotations

from typing import Any

import orjson

from airflow_batch_provider.backends.anthropic.results import STOP_REASONS, parse_anthropic_result
from airflow_batch_provider.descriptors import ResultRecord
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.results.parse import result_record

_NOVA_STOP_REASONS = {**STOP_REASONS, "content_filtered": "content_filter"}


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
            return result_record(custom_id, "errored", error=str(error))
        code = error.get("errorCode")
        status_code = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
        return result_record(
            custom_id,
            "errored",
            error=error.get("errorMessage") or f"error {code}",
            error_code=None if code is None else str(code),
            http_status=status_code,
        )
    output = obj.get("modelOutput")
    if not isinstance(output, dict):
        return result_record(custom_id, "errored", error="result line has neither modelOutput nor error")
    response, finish_reason, input_tokens, output_tokens = _bedrock_output(output)
    return result_record(
        custom_id,
        "succeeded",
        response=response,
        finish_reason=finish_reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
