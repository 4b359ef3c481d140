"""Turn one OpenAI request body into vLLM's request objects, row by row, before anything is generated.

Every check here is per row, so that one bad row becomes one error line instead of failing the
chunk: :func:`build_sampling_params` maps a ``/v1/chat/completions`` body to ``SamplingParams``
(built with the installed vLLM's own class, so its own validation runs), applying the model's
``generation_config`` defaults the way ``vllm serve`` does; :func:`embedding_inputs` reads a
``/v1/embeddings`` body; :func:`prompt_too_long` compares a prompt's token count with the
engine's ``max_model_len`` using vLLM's rule. Problems are raised as :class:`RowRejected`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batch_provider.hooks.vllm_engine import VLLMEngine

# Body keys copied unchanged into SamplingParams (vLLM uses the OpenAI names, plus its own extras).
_PASSTHROUGH = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
)
# Body keys that need no SamplingParams counterpart: consumed elsewhere or harmless to drop.
_HANDLED = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "response_format",
        "stream",
        "user",
        "store",
        "echo",
    }
)
_NO_TOOLS = "tool calling is not supported by VLLMGenerateOperator; use response_schema (guided decoding)"
_UNSUPPORTED = {
    "tools": _NO_TOOLS,
    "tool_choice": _NO_TOOLS,
    "functions": "function calling is not supported by VLLMGenerateOperator; use response_schema",
    "function_call": "function calling is not supported by VLLMGenerateOperator; use response_schema",
    "suffix": "'suffix' (insertion) is not supported by VLLMGenerateOperator",
}


class RowRejected(ValueError):
    """Report why one request cannot be sent; the row gets a final (HTTP 400) error line, the chunk goes on."""

    def __init__(self, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.code = code


def sampling_kwargs(
    body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """Map a chat request body to (SamplingParams kwargs, structured-output kwargs or None, ignored keys).

    ``max_tokens`` / ``max_completion_tokens`` become ``max_tokens``. A sampling key the body
    leaves unset takes the model's ``generation_config`` value from ``defaults`` (as ``vllm serve``
    does), else vLLM's own default; ``max_tokens`` unset everywhere stays None (generate up to the
    context length, as OpenAI does — not vLLM's class default of 16). ``n`` must be 1.
    ``response_format`` ``json_schema`` becomes ``{"json": schema}``, ``json_object`` becomes
    ``{"json_object": True}``. Raises RowRejected for what cannot be honoured.
    """
    for key, reason in _UNSUPPORTED.items():
        if body.get(key) is not None:
            raise RowRejected(f"'{key}': {reason}.")
    if body.get("echo"):
        raise RowRejected("'echo' is not supported by VLLMGenerateOperator; drop it (the prompt is in your table).")
    n = body.get("n")
    if n not in (None, 1):
        raise RowRejected(f"'n' must be 1 (one completion per request), got {n!r}.")
    kwargs: dict[str, Any] = {"n": 1, **(defaults or {})}
    for key in _PASSTHROUGH:
        if body.get(key) is not None:
            kwargs[key] = body[key]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise RowRejected(f"'max_tokens' must be a positive integer, got {limit!r}.")
    kwargs["max_tokens"] = limit if limit is not None else kwargs.get("max_tokens")
    structured = _structured(body.get("response_format"))
    ignored = sorted(k for k in body if k not in _HANDLED and k not in _PASSTHROUGH)
    return kwargs, structured, ignored


def _structured(response_format: Any) -> dict[str, Any] | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise RowRejected("'response_format.json_schema.schema' must be a JSON Schema object.")
        return {"json": dict(schema)}
    raise RowRejected(f"'response_format' type {kind!r} is not supported (text, json_object, json_schema).")


def build_sampling_params(engine: VLLMEngine, body: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """Return (SamplingParams for ``body``, body keys that were ignored); raise RowRejected.

    The parameters go through the installed vLLM's ``SamplingParams`` (and structured-output
    class), so everything vLLM would refuse at ``llm.chat`` time — ``top_p=0``, ``stop=[""]``,
    ``min_tokens > max_tokens``, a temperature out of range — is refused here, for this row only.
    """
    kwargs, structured, ignored = sampling_kwargs(body, engine.sampling_defaults)
    classes = engine.classes
    try:
        if structured is not None:
            if classes.structured_outputs is None:
                raise RowRejected(
                    f"this vLLM ({classes.version}) has no structured-output support, but the request asks for "
                    f"{sorted(structured)} output; upgrade vLLM or drop response_schema."
                )
            keyword, params_class = classes.structured_outputs
            kwargs[keyword] = params_class(**structured)
        return classes.sampling_params(**kwargs), ignored
    except classes.client_errors as exc:
        if isinstance(exc, RowRejected):
            raise
        raise RowRejected(f"vLLM rejected the sampling parameters: {exc}") from exc


def completion_prompt(body: Mapping[str, Any]) -> Any:
    """Return the one prompt of a ``/v1/completions`` body (a string, or vLLM's TokensPrompt); raise RowRejected."""
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise RowRejected("'prompt' is empty; vLLM refuses empty prompts.")
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return {"prompt_token_ids": value}
    raise RowRejected("'prompt' must be one non-empty string or token array (one completion per request).")


def embedding_inputs(body: Mapping[str, Any]) -> list[Any]:
    """Return the prompts of an embeddings body (strings, or ``{"prompt_token_ids": [...]}``); raise RowRejected."""
    if body.get("dimensions") is not None:
        raise RowRejected("'dimensions' is not supported by VLLMGenerateOperator; drop it.")
    value = body.get("input")
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, int) for v in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RowRejected("'input' must be a non-empty string or array.")
    prompts: list[Any] = []
    for item in value:
        if isinstance(item, str) and item:
            prompts.append(item)
        elif isinstance(item, list) and item and all(isinstance(v, int) for v in item):
            prompts.append({"prompt_token_ids": item})  # vLLM's TokensPrompt
        else:
            raise RowRejected("'input' items must be non-empty strings or token arrays.")
    return prompts


def prompt_too_long(engine: VLLMEngine, prompt: Any) -> RowRejected | None:
    """Return the rejection vLLM would raise for ``prompt``'s length (None when it fits or cannot be counted).

    vLLM's rule: a generating model needs room for at least one output token, so its prompt must be
    shorter than ``max_model_len``; a pooling (embedding) model takes up to ``max_model_len``.
    """
    if engine.count_prompt is None or engine.max_model_len is None:
        return None
    generating = engine.runner == "generate"
    bound = engine.bound_prompt(prompt) if engine.bound_prompt is not None else None
    if bound is not None and 0 < bound < engine.max_model_len + (0 if generating else 1):
        return None  # fits for sure: no template rendering or tokenizing here (vLLM does both again)
    tokens = engine.count_prompt(prompt)
    if tokens is None:
        return None
    limit = engine.max_model_len
    if tokens == 0:
        return RowRejected("the prompt is empty (0 tokens); vLLM refuses empty prompts.")
    if tokens > limit or (generating and tokens == limit):
        room = " and leave room for at least one output token" if generating else ""
        return RowRejected(
            f"the prompt has {tokens} tokens; with max_model_len={limit} it must be at most "
            f"{limit - 1 if generating else limit}{room}. Shorten the input or raise max_model_len.",
            code="context_length_exceeded",
        )
    return None
