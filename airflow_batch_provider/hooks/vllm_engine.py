"""The one place that imports vLLM, and the translation of OpenAI request bodies into vLLM calls.

:func:`create_engine` is the single factory vLLMGenerateOperator calls: it imports ``vllm``
(an optional extra: ``pip install 'airflow-batch-provider[vllm]'``), loads the model with
``vllm.LLM(**engine_args)`` and returns a :class:`VLLMEngine` bundle (the ``LLM``, the
``SamplingParams`` class, and the structured-output parameter class this vLLM version has).
Tests replace the factory with a stand-in that has vLLM's call signatures.

Everything else here is plain Python over that bundle: :func:`sampling_kwargs` maps one
``/v1/chat/completions`` body to ``SamplingParams`` keyword arguments, :func:`run_chat` and
:func:`run_embed` send a whole chunk in one ``llm.chat`` / ``llm.embed`` call (so vLLM's
continuous batching keeps the GPU full) and yield one OpenAI-shaped response body per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.hooks.local_results import chat_completion_body, embedding_body

INSTALL_HINT = "pip install 'airflow-batch-provider[vllm]'"

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
)
# Body keys that need no SamplingParams counterpart: consumed elsewhere or harmless to drop.
_HANDLED = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "n", "response_format", "stream", "user", "store"}
)
_UNSUPPORTED = {
    "tools": "tool calling is not supported by vLLMGenerateOperator; use response_schema (guided decoding)",
    "tool_choice": "tool calling is not supported by vLLMGenerateOperator; use response_schema (guided decoding)",
    "functions": "function calling is not supported by vLLMGenerateOperator; use response_schema",
    "function_call": "function calling is not supported by vLLMGenerateOperator; use response_schema",
}


class EngineUnavailableError(BatchProviderError):
    """Report that vLLM cannot be imported on this worker (not installed, or a broken install)."""


class UnsupportedRequestError(ValueError):
    """Report a request body this engine cannot answer; the row gets an error line, the chunk goes on."""


@dataclass(frozen=True)
class VLLMEngine:
    """A loaded model plus the vLLM classes its requests need.

    ``structured_outputs`` is ``(SamplingParams keyword, params class)``: ``("structured_outputs",
    StructuredOutputsParams)`` on current vLLM, ``("guided_decoding", GuidedDecodingParams)`` before
    0.12, or None when this vLLM has neither.
    """

    llm: Any
    sampling_params: Callable[..., Any]
    structured_outputs: tuple[str, Callable[..., Any]] | None = None
    version: str = "unknown"


def create_engine(**engine_args: Any) -> VLLMEngine:
    """Import vLLM and load ``vllm.LLM(**engine_args)``; raise EngineUnavailableError with the install hint."""
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except (ImportError, OSError) as exc:
        raise EngineUnavailableError(
            f"vLLMGenerateOperator needs vLLM on the worker that runs it, but importing vllm failed ({exc}). "
            f"Install the extra on your GPU workers: {INSTALL_HINT} (see docker/Dockerfile.gpu), "
            "and route the task to them with queue='gpu'."
        ) from exc
    structured = structured_outputs_support()
    llm = LLM(**engine_args)
    return VLLMEngine(
        llm=llm,
        sampling_params=SamplingParams,
        structured_outputs=structured,
        version=str(getattr(vllm, "__version__", "unknown")),
    )


def structured_outputs_support() -> tuple[str, Callable[..., Any]] | None:
    """Return the structured-output keyword and class of the installed vLLM (None when it has none)."""
    try:
        from vllm import sampling_params as module
    except ImportError:
        return None
    current = getattr(module, "StructuredOutputsParams", None)
    if current is not None:
        return "structured_outputs", current
    legacy = getattr(module, "GuidedDecodingParams", None)
    if legacy is not None:
        return "guided_decoding", legacy
    return None


# ------------------------------------------------------------------------------------- mapping


def sampling_kwargs(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """Map a chat request body to (SamplingParams kwargs, structured-output kwargs or None, ignored keys).

    ``max_tokens`` / ``max_completion_tokens`` become ``max_tokens``; without either it is None
    (generate up to the model's context, as OpenAI does — vLLM's own default is 16 tokens).
    ``n`` must be 1. ``response_format`` ``json_schema`` becomes ``{"json": schema}``,
    ``json_object`` becomes ``{"json_object": True}``. Raises UnsupportedRequestError for what
    cannot be honoured (``n > 1``, tool calling, an unknown response format).
    """
    for key, reason in _UNSUPPORTED.items():
        if body.get(key) is not None:
            raise UnsupportedRequestError(f"'{key}': {reason}.")
    n = body.get("n")
    if n not in (None, 1):
        raise UnsupportedRequestError(f"'n' must be 1 (one completion per request), got {n!r}.")
    kwargs: dict[str, Any] = {"n": 1}
    for key in _PASSTHROUGH:
        if body.get(key) is not None:
            kwargs[key] = body[key]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise UnsupportedRequestError(f"'max_tokens' must be a positive integer, got {limit!r}.")
    kwargs["max_tokens"] = limit
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
            raise UnsupportedRequestError("'response_format.json_schema.schema' must be a JSON Schema object.")
        return {"json": dict(schema)}
    raise UnsupportedRequestError(f"'response_format' type {kind!r} is not supported (text, json_object, json_schema).")


def build_sampling_params(engine: VLLMEngine, body: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """Return (SamplingParams for ``body``, body keys that were ignored)."""
    kwargs, structured, ignored = sampling_kwargs(body)
    if structured is not None:
        if engine.structured_outputs is None:
            raise UnsupportedRequestError(
                f"this vLLM ({engine.version}) has no structured-output support, but the request asks for "
                f"{sorted(structured)} output; upgrade vLLM or drop response_schema."
            )
        keyword, params_class = engine.structured_outputs
        kwargs[keyword] = params_class(**structured)
    return engine.sampling_params(**kwargs), ignored


# ----------------------------------------------------------------------------------------- calls


@dataclass
class Answer:
    """One request's answer: an OpenAI response body, or an error message (HTTP-400-like)."""

    index: int
    body: dict[str, Any] | None = None
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0


def run_chat(
    engine: VLLMEngine,
    requests: Sequence[tuple[int, Mapping[str, Any]]],
    *,
    model: str,
    request_ids: Sequence[str],
    on_ignored: Callable[[list[str]], None] | None = None,
) -> Iterator[Answer]:
    """Answer ``(index, chat body)`` pairs with ONE ``llm.chat`` call; yield an :class:`Answer` per pair.

    Requests whose parameters cannot be mapped are answered with an error and left out of the
    call. ``request_ids[index]`` becomes the completion id of the request at ``index``.
    """
    conversations: list[Any] = []
    params: list[Any] = []
    sent: list[int] = []
    ignored: set[str] = set()
    for index, body in requests:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            yield Answer(index, error="'messages' must be a non-empty array.")
            continue
        try:
            sampling, skipped = build_sampling_params(engine, body)
        except UnsupportedRequestError as exc:
            yield Answer(index, error=str(exc))
            continue
        ignored.update(skipped)
        conversations.append(messages)
        params.append(sampling)
        sent.append(index)
    if ignored and on_ignored is not None:
        on_ignored(sorted(ignored))
    if not sent:
        return
    outputs = engine.llm.chat(conversations, sampling_params=params, use_tqdm=False)
    if len(outputs) != len(sent):
        raise BatchProviderError(f"vLLM returned {len(outputs)} outputs for {len(sent)} chat requests.")
    for index, output in zip(sent, outputs):
        completion = output.outputs[0]
        prompt_tokens = len(output.prompt_token_ids or ())
        completion_tokens = len(completion.token_ids or ())
        body = chat_completion_body(
            completion_id=request_ids[index],
            model=model,
            text=completion.text,
            finish_reason=completion.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
        yield Answer(index, body=body, input_tokens=prompt_tokens, output_tokens=completion_tokens)


def _embedding_inputs(body: Mapping[str, Any]) -> list[Any]:
    if body.get("dimensions") is not None:
        raise UnsupportedRequestError("'dimensions' is not supported by vLLMGenerateOperator; drop it.")
    value = body.get("input")
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, int) for v in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise UnsupportedRequestError("'input' must be a non-empty string or array.")
    prompts: list[Any] = []
    for item in value:
        if isinstance(item, str) and item:
            prompts.append(item)
        elif isinstance(item, list) and item and all(isinstance(v, int) for v in item):
            prompts.append({"prompt_token_ids": item})  # vLLM's TokensPrompt
        else:
            raise UnsupportedRequestError("'input' items must be non-empty strings or token arrays.")
    return prompts


def run_embed(engine: VLLMEngine, requests: Sequence[tuple[int, Mapping[str, Any]]], *, model: str) -> Iterator[Answer]:
    """Answer ``(index, embeddings body)`` pairs with ONE ``llm.embed`` call; yield an :class:`Answer` per pair."""
    prompts: list[Any] = []
    spans: list[tuple[int, int, int]] = []  # (index, start, end) into prompts
    for index, body in requests:
        try:
            inputs = _embedding_inputs(body)
        except UnsupportedRequestError as exc:
            yield Answer(index, error=str(exc))
            continue
        spans.append((index, len(prompts), len(prompts) + len(inputs)))
        prompts.extend(inputs)
    if not prompts:
        return
    outputs = engine.llm.embed(prompts, use_tqdm=False)
    if len(outputs) != len(prompts):
        raise BatchProviderError(f"vLLM returned {len(outputs)} embeddings for {len(prompts)} inputs.")
    for index, start, end in spans:
        part = outputs[start:end]
        vectors = [[float(v) for v in out.outputs.embedding] for out in part]
        tokens = sum(len(out.prompt_token_ids or ()) for out in part)
        yield Answer(
            index, body=embedding_body(model=model, vectors=vectors, prompt_tokens=tokens), input_tokens=tokens
        )
