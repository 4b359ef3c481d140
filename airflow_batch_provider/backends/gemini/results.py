"""Parse Gemini batch result lines into the merged schema's records.

Each line of a batch's result file is ``{"key": ..., "response": GenerateContentResponse}`` or
``{"key": ..., "error": {"code", "message", "status"}}`` (a ``google.rpc.Status``). A line never
raises for an odd body: an unreadable answer becomes an ``errored`` record that says why; only a
line without a key (which no row could be matched to) raises.
"""

from __future__ import annotations

from typing import Any

import orjson

from airflow_batch_provider.descriptors import ResultRecord
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.results.parse import result_record as _record

#: Gemini finish reasons in the merged schema's words (others are kept, lower-cased).
FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}


def _answer_text(candidate: dict[str, Any]) -> str | None:
    """Join the candidate's text parts, leaving out thought summaries (``thought: true``)."""
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return None
    texts = [
        part["text"]
        for part in parts
        if isinstance(part, dict) and isinstance(part.get("text"), str) and not part.get("thought")
    ]
    return "".join(texts) if texts else None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _error_record(key: str, error: Any) -> ResultRecord:
    if not isinstance(error, dict):
        return _record(key, "errored", error=str(error))
    code = error.get("code")
    http = code if isinstance(code, int) and not isinstance(code, bool) else None
    return _record(
        key,
        "errored",
        error=str(error.get("message") or error.get("status") or f"error {code}"),
        error_code=error.get("status") or (f"http_{http}" if http else None),
        http_status=http,
    )


def _response_record(key: str, response: dict[str, Any]) -> ResultRecord:
    usage = _mapping(response.get("usageMetadata"))
    prompt = usage.get("promptTokenCount")
    # Thinking tokens are billed as output tokens.
    output = (usage.get("candidatesTokenCount") or 0) + (usage.get("thoughtsTokenCount") or 0)
    # promptTokenCount includes the implicitly cached tokens; cachedContentTokenCount says how many.
    cached = usage.get("cachedContentTokenCount")
    tokens = {"input_tokens": prompt, "output_tokens": output, "cached_input_tokens": cached}
    candidates = response.get("candidates")
    if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
        reason = _mapping(response.get("promptFeedback")).get("blockReason")
        if reason:
            return _record(key, "errored", error=f"prompt blocked: {reason}", error_code="prompt_blocked", **tokens)
        return _record(key, "errored", error="response has no candidates", error_code="no_candidates", **tokens)
    candidate = candidates[0]
    raw_reason = candidate.get("finishReason")
    reason = FINISH_REASONS.get(raw_reason, str(raw_reason).lower()) if raw_reason else None
    text = _answer_text(candidate)
    if text is None and reason == "content_filter":
        return _record(key, "errored", error=f"answer withheld: {raw_reason}", error_code="content_filter", **tokens)
    return _record(key, "succeeded", response=text, finish_reason=reason, http_status=200, **tokens)


def parse_gemini_line(line: bytes | str) -> ResultRecord:
    """Parse one line of a Gemini batch result file."""
    try:
        obj = orjson.loads(line)
        key = obj["key"]
        if not isinstance(key, str):
            raise TypeError(f"key is a {type(key).__name__}")
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ResultsError(f"Unreadable Gemini result line ({exc}): {str(line)[:200]!r}") from exc
    if obj.get("error"):
        return _error_record(key, obj["error"])
    response = obj.get("response")
    if not isinstance(response, dict):
        return _record(key, "errored", error="result line has neither response nor error")
    return _response_record(key, response)
