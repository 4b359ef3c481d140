"""Deterministic synthetic model outputs for the OpenAI endpoints, plus shared text helpers.

Every answer is a pure function of the request (a hash of the model and the messages), so the
same request always gets the same answer. Token counts are estimates: ``ceil(chars / 4)`` of
the text, plus 3 per message for prompts.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import re
import struct
from typing import Any

import orjson

from airflow_batch_emulator.schema import WORDS, schema_instance

_LABELS = re.compile(r"(?:\blabels?|\bcategories|\bclasses|\bone of)\s*:[ \t]*([^\n]+)", re.IGNORECASE)
DEFAULT_DIMENSIONS = 16


class ParamError(Exception):
    """A request body the model endpoint rejects (answered as 400 ``invalid_request_error``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def estimate_tokens(text: str) -> int:
    """Estimate tokens as ``ceil(len(text) / 4)``."""
    return (len(text) + 3) // 4


def content_text(content: Any) -> str:
    """Return the plain text of a message ``content`` (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    pieces.append(text)
                elif isinstance(part.get("content"), (str, list)):
                    pieces.append(content_text(part["content"]))
        return "\n".join(pieces)
    return ""


def messages_text(messages: list[Any]) -> list[str]:
    """Return the text of each message of a chat/messages request."""
    return [content_text(m.get("content")) if isinstance(m, dict) else "" for m in messages]


def prompt_tokens(texts: list[str]) -> int:
    """Estimate prompt tokens: ``ceil(chars / 4) + 3`` per message."""
    return sum(estimate_tokens(text) + 3 for text in texts)


# Claude's input tokens are counted as the provider package's cost estimate counts them (it has no
# offline tokenizer either): 3.5 characters a token, 2.7 for the Claude 5 generation's tokenizer, and
# 3 per message. "Actual vs expected" then measures the estimate's pricing, not two counting rules.
_CLAUDE_NEW_TOKENIZER = ("claude-sonnet-5", "claude-opus-5", "claude-fable", "claude-mythos", "claude-haiku-5")


def claude_tokens(model: str, text: str) -> int:
    """Return the tokens of ``text`` for a Claude ``model`` (the provider's approximation)."""
    chars_per_token = 2.7 if model.startswith(_CLAUDE_NEW_TOKENIZER) else 3.5
    return math.ceil(len(text) / chars_per_token)


def claude_prompt_tokens(model: str, system: str, tools: str, messages: list[str]) -> int:
    """Return a Messages request's input tokens: system prompt, tool definitions, 3 + text per message."""
    return sum(claude_tokens(model, piece) for piece in (system, tools)) + sum(
        3 + claude_tokens(model, text) for text in messages
    )


def request_key(*parts: bytes) -> bytes:
    """Hash request parts into the 32-byte key that fixes every synthetic choice."""
    return hashlib.blake2b(b"\x1f".join(parts), digest_size=32).digest()


def rng_for(key: bytes) -> random.Random:
    """Return a random generator seeded by ``key``."""
    return random.Random(int.from_bytes(key[:16], "big"))


def answer_text(key: bytes, prompt: str) -> str:
    """Pick one of the prompt's offered labels, or else make a short deterministic sentence."""
    matches = _LABELS.findall(prompt)
    if matches:
        labels = [label.strip().strip(".").strip() for label in re.split(r",|\||\bor\b", matches[-1])]
        labels = [label for label in labels if label]
        if labels:
            return labels[int.from_bytes(key[:4], "big") % len(labels)]
    count = 6 + key[4] % 18
    words = " ".join(WORDS[b % len(WORDS)] for b in key[5 : 5 + count])
    return f"Synthetic answer: {words}."


def truncate(text: str, max_tokens: Any) -> tuple[str, int, bool]:
    """Cut ``text`` to ``max_tokens``; return (text, completion tokens, whether it was cut)."""
    tokens = estimate_tokens(text)
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and 0 < max_tokens < tokens:
        return text[: max_tokens * 4], max_tokens, True
    return text, tokens, False


def cut_text(text: str) -> str:
    """Return ``text`` cut off part-way, as an answer that ran into max_tokens (never the whole text)."""
    return text[: max(0, min(len(text) - 1, len(text) // 2))]


def cut_openai_answer(body: dict[str, Any]) -> None:
    """Cut a chat/completions answer short in place, as the model reaching max_tokens would."""
    for choice in body.get("choices") or []:
        message = choice.get("message")
        if isinstance(message, dict):
            if isinstance(message.get("content"), str):
                message["content"] = cut_text(message["content"])
            for call in message.get("tool_calls") or []:
                call["function"]["arguments"] = cut_text(call["function"]["arguments"])
        elif isinstance(choice.get("text"), str):
            choice["text"] = cut_text(choice["text"])
        choice["finish_reason"] = "length"


def cut_anthropic_answer(answer: dict[str, Any]) -> None:
    """Cut a Messages answer short in place: text ends early, a tool call loses its last field."""
    for block in answer.get("content") or []:
        if block.get("type") == "text":
            block["text"] = cut_text(block["text"])
        elif block.get("type") == "tool_use" and isinstance(block.get("input"), dict) and block["input"]:
            block["input"].pop(list(block["input"])[-1])
    answer["stop_reason"] = "max_tokens"


def structured_text(response_format: Any, key: bytes) -> str | None:
    """Return JSON text for a ``json_schema``/``json_object`` response format, else None."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema", response_format)
        schema = spec.get("schema", {}) if isinstance(spec, dict) else {}
        return orjson.dumps(schema_instance(schema, rng_for(key))).decode()
    if kind == "json_object":
        return orjson.dumps({"answer": answer_text(key, "")}).decode()
    return None


def _require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ParamError("you must provide a model parameter", "model")
    return model


def _forced_function(body: dict[str, Any]) -> tuple[str, Any] | None:
    """Return (name, parameters schema) when ``tool_choice`` forces a function call."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    name = str((choice.get("function") or {}).get("name"))
    for tool in body.get("tools") or []:
        function = tool.get("function", {}) if isinstance(tool, dict) else {}
        if function.get("name") == name:
            return name, function.get("parameters", {})
    raise ParamError(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")


def chat_completion(body: dict[str, Any], created: int) -> dict[str, Any]:
    """Answer a ``/v1/chat/completions`` request body."""
    model = _require_model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ParamError("'messages' is a required property and must be a non-empty array", "messages")
    key = request_key(model.encode(), orjson.dumps(messages, option=orjson.OPT_SORT_KEYS))
    texts = messages_text(messages)
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
    finish = "stop"
    forced = _forced_function(body)
    if forced is not None:
        arguments = orjson.dumps(schema_instance(forced[1], rng_for(key))).decode()
        message["tool_calls"] = [
            {
                "id": "call_" + key.hex()[:24],
                "type": "function",
                "function": {"name": forced[0], "arguments": arguments},
            }
        ]
        completion = estimate_tokens(arguments)
    else:
        text = structured_text(body.get("response_format"), key) or answer_text(key, "\n".join(texts))
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        message["content"], completion, truncated = truncate(text, limit)
        finish = "length" if truncated else "stop"
    prompt = prompt_tokens(texts)
    return {
        "id": "chatcmpl-" + key.hex()[:29],
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_emulator",
    }


def embedding_vector(model: str, key: bytes, dimensions: int) -> list[float]:
    """Return a unit-length vector fixed by (model, key)."""
    raw = hashlib.shake_256(model.encode() + b"\x1f" + key).digest(dimensions * 2)
    ints = struct.unpack(f"<{dimensions}h", raw)
    norm = math.sqrt(sum(v * v for v in ints)) or 1.0
    return [v / norm for v in ints]


def _embedding_inputs(value: Any) -> list[tuple[bytes, int]]:
    """Return (hash key, token count) per input of an embeddings request."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, int) for v in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ParamError("'input' must be a non-empty string or array", "input")
    result: list[tuple[bytes, int]] = []
    for item in value:
        if isinstance(item, str) and item:
            result.append((item.encode(), estimate_tokens(item)))
        elif isinstance(item, list) and item and all(isinstance(v, int) for v in item):
            result.append((orjson.dumps(item), len(item)))
        else:
            raise ParamError("'input' items must be non-empty strings or token arrays", "input")
    return result


def embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """Answer a ``/v1/embeddings`` request body (``encoding_format`` float or base64)."""
    model = _require_model(body)
    inputs = _embedding_inputs(body.get("input"))
    dims = body.get("dimensions") or DEFAULT_DIMENSIONS
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= 8192:
        raise ParamError(f"'dimensions' must be an integer between 1 and 8192, got {dims!r}", "dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ParamError(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}", "encoding_format")
    data: list[dict[str, Any]] = []
    for index, (key, _) in enumerate(inputs):
        vector = embedding_vector(model, key, dims)
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": value})
    tokens = sum(count for _, count in inputs)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def completion(body: dict[str, Any], created: int) -> dict[str, Any]:
    """Answer a legacy ``/v1/completions`` request body."""
    model = _require_model(body)
    prompt = body.get("prompt")
    text_in = prompt if isinstance(prompt, str) else "\n".join(p for p in prompt or [] if isinstance(p, str))
    key = request_key(model.encode(), text_in.encode())
    text, tokens, truncated = truncate(answer_text(key, text_in), body.get("max_tokens"))
    used = estimate_tokens(text_in)
    return {
        "id": "cmpl-" + key.hex()[:29],
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "length" if truncated else "stop"}],
        "usage": {"prompt_tokens": used, "completion_tokens": tokens, "total_tokens": used + tokens},
    }


def response(body: dict[str, Any], created: int) -> dict[str, Any]:
    """Answer a ``/v1/responses`` request body (``text.format`` json_schema honoured)."""
    model = _require_model(body)
    raw_input = body.get("input")
    texts = [raw_input] if isinstance(raw_input, str) else messages_text(list(raw_input or []))
    if isinstance(body.get("instructions"), str):
        texts.insert(0, body["instructions"])
    key = request_key(model.encode(), orjson.dumps(texts))
    text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    text = structured_text(text_format, key) or answer_text(key, "\n".join(texts))
    text, out_tokens, truncated = truncate(text, body.get("max_output_tokens"))
    in_tokens = prompt_tokens(texts)
    return {
        "id": "resp_" + key.hex()[:32],
        "object": "response",
        "created_at": created,
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "model": model,
        "output": [
            {
                "type": "message",
                "id": "msg_" + key.hex()[32:56],
                "status": "incomplete" if truncated else "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": in_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": in_tokens + out_tokens,
        },
    }


def moderation(body: dict[str, Any], created: int) -> dict[str, Any]:
    """Answer a ``/v1/moderations`` request body: nothing is ever flagged."""
    raw = body.get("input")
    inputs = raw if isinstance(raw, list) else [raw]
    model = body.get("model") or "omni-moderation-latest"
    return {
        "id": "modr-" + request_key(orjson.dumps(inputs)).hex()[:24],
        "model": model,
        "results": [{"flagged": False, "categories": {}, "category_scores": {}} for _ in inputs],
    }


def unique_id(body: dict[str, Any], suffix: str) -> None:
    """Replace the hash part of ``body["id"]`` (when present) by ``suffix``, keeping a prefix like ``chatcmpl-``."""
    old = body.get("id")
    if isinstance(old, str):
        cut = min((i for i in (old.find("-"), old.find("_")) if i >= 0), default=-1)
        body["id"] = old[: cut + 1] + suffix


def request_tokens(endpoint: str, body: Any) -> int:
    """Estimate the input tokens one batch line enqueues (for the token-limit fault)."""
    if not isinstance(body, dict):
        return 0
    if endpoint == "/v1/chat/completions" and isinstance(body.get("messages"), list):
        return prompt_tokens(messages_text(body["messages"]))
    return estimate_tokens(orjson.dumps(body).decode())


OPENAI_BUILDERS: dict[str, Any] = {
    "/v1/chat/completions": chat_completion,
    "/v1/completions": completion,
    "/v1/responses": response,
    "/v1/moderations": moderation,
    "/v1/embeddings": lambda body, created: embeddings(body),
}
