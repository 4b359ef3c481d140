"""The OpenAI Batch API backend: limits, endpoints, parameter checks, prices, tokens, console link.

The hook (:mod:`.hook`, the ``openai`` SDK) and the renderer (:mod:`.requests`) are imported only
when a chunk names this provider; this module stays import-light (see
:mod:`airflow_batch_provider.backends.base`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_batch_provider.backends.base import Backend, CountableRequest, TokenRules
from airflow_batch_provider.backends.openai.connection import CONNECTION_INFO
from airflow_batch_provider.chunking.limits import MB, ProviderLimits

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer
    from airflow_batch_provider.contract import ModelKind, SpecFields
    from airflow_batch_provider.descriptors import ResultRecord

OPENAI_LIMITS = ProviderLimits(
    provider="openai",
    max_requests=50_000,
    max_bytes=200 * MB,
    default_byte_cap=190 * MB,
    endpoints=frozenset(
        {"/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses", "/v1/moderations"}
    ),
    max_custom_id_chars=512,
)

MODEL_PREFIXES: tuple[str, ...] = ("gpt-", "o1", "o3", "o4", "text-embedding", "chatgpt-", "ft:", "davinci", "babbage")

# Keys the renderer writes itself; a caller setting them in ``params`` is a mistake.
_RESERVED = frozenset({"model", "messages", "input", "prompt", "stream"})
TOKENS_PER_MESSAGE = 4  # 3 framing tokens + the role, per OpenAI's chat-format accounting
REPLY_PRIMING = 3
# Chat (text-generation) families, optionally fine-tuned: gpt-4o-mini, chatgpt-4o-latest, o1, o3-mini, ft:gpt-4o:...
_CHAT_MODEL = re.compile(r"^(?:ft:)?(?:gpt-|chatgpt-|o\d+(?:-|:|$))", re.IGNORECASE)


def encoding_name_for(model: str) -> str | None:
    """Return the tiktoken encoding of an OpenAI model (None for a model that is not OpenAI's)."""
    if not OpenAIBackend().owns_model(model):
        return None
    try:
        from tiktoken.model import encoding_name_for_model

        return encoding_name_for_model(model)
    except (ImportError, KeyError):
        pass
    if model.startswith(("text-embedding", "gpt-3.5", "gpt-4-", "ft:gpt-4:", "ft:gpt-3.5")) or model == "gpt-4":
        return "cl100k_base"
    return "o200k_base"


class OpenAIBackend(Backend):
    """OpenAI Batch API: ``{custom_id, method, url, body}`` lines, 50,000 requests and 200 MB a batch."""

    name = "openai"
    title = "OpenAI Batch"
    limits = OPENAI_LIMITS
    endpoints: ClassVar[tuple[str, ...]] = ("/v1/chat/completions", "/v1/embeddings", "/v1/completions")
    hook_class_path = "airflow_batch_provider.backends.openai.hook:OpenAIBatchHook"
    connection_type = "openai_batch"
    sdk_module = "openai"
    sdk_requirement = "airflow-batch-provider[openai]"
    default_model = "gpt-4o-mini"
    model_prefixes: ClassVar[tuple[str, ...]] = MODEL_PREFIXES
    prices_source = "OpenAI API pricing page (platform/developers.openai.com/api/docs/pricing)"
    # Real-time list prices, USD per 1M tokens (input, output); the Batch API halves them.
    prices = {
        "gpt-4o-mini": (0.15, 0.60),
        "gpt-4o": (2.50, 10.00),
        "gpt-4.1": (2.00, 8.00),
        "gpt-4.1-mini": (0.40, 1.60),
        "gpt-4.1-nano": (0.10, 0.40),
        "o4-mini": (1.10, 4.40),
        "gpt-5": (1.25, 10.00),
        "gpt-5-mini": (0.25, 2.00),
        "gpt-5-nano": (0.05, 0.40),
        "gpt-5.4": (2.50, 15.00),  # under 272K input tokens; longer prompts cost more
        "gpt-5.4-mini": (0.75, 4.50),
        "gpt-5.4-nano": (0.20, 1.25),
        "gpt-5.5": (5.00, 30.00),
        "text-embedding-3-small": (0.02, 0.0),
        "text-embedding-3-large": (0.13, 0.0),
    }
    # us./eu. are OpenAI's data-residency API hosts; their batches show in the same console.
    console_hosts: ClassVar[tuple[str, ...]] = ("api.openai.com", "us.api.openai.com", "eu.api.openai.com")
    console_template: ClassVar[str | None] = "https://platform.openai.com/batches/{batch_id}"
    # error.code of output lines (HTTP 5xx/429/408 bodies) and error-file lines that a later batch may get answered.
    retryable_line_errors = frozenset(
        {
            "server_error",
            "internal_error",
            "internal_server_error",
            "service_unavailable",
            "rate_limit_exceeded",
            "timeout",
            "request_timeout",
            "batch_expired",
        }
    )
    # A batch over the organisation's enqueued-token limit fails validation with this code alone.
    capacity_refusal_codes = frozenset({"token_limit_exceeded"})

    def check_params(self, spec: SpecFields) -> None:
        """Reject parameters the renderer writes itself, and a schema given twice."""
        from airflow_batch_provider.exceptions import InvalidInputError

        bad = sorted(_RESERVED & spec.params.keys())
        if bad:
            raise InvalidInputError(f"params may not set {bad}: the request renderer writes these itself.")
        if spec.json_schema is not None and "response_format" in spec.params:
            raise InvalidInputError("Pass either response_schema or params['response_format'], not both.")

    def model_kind(self, model: str) -> ModelKind | None:
        """Return "chat" for the gpt, chatgpt and o-series families (a fine-tune too), else None."""
        return "chat" if _CHAT_MODEL.match(model) and "embed" not in model.lower() else None

    def renderer(self, spec: SpecFields) -> RequestRenderer:
        """Return the OpenAI Batch API line renderer."""
        from airflow_batch_provider.backends.openai.requests import OpenAIRenderer

        return OpenAIRenderer(spec)

    def parse_result(self, line: bytes | str | Mapping[str, Any]) -> ResultRecord:
        """Parse one line of an OpenAI batch output or error file."""
        from airflow_batch_provider.results.parse import parse_openai_line

        return parse_openai_line(line if isinstance(line, bytes | str) else _dumps(line))

    def connection_info(self) -> dict[str, Any]:
        """Return the ``openai_batch`` connection type (API key, base URL, organization, project)."""
        return CONNECTION_INFO

    def token_rules(self, model: str) -> TokenRules:
        """Return tiktoken's encoding for the model (exact when its BPE file is on disk), else 4 chars a token."""
        return TokenRules(4.0, encoding_name_for(model))

    def countable_request(self, line: Mapping[str, Any]) -> CountableRequest | None:
        """Return the ``body`` of a ``{custom_id, method, url, body}`` line."""
        body = line.get("body")
        return CountableRequest(body, TOKENS_PER_MESSAGE, REPLY_PRIMING) if isinstance(body, Mapping) else None


def _dumps(obj: Mapping[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(obj)
