"""The Anthropic Message Batches backend: limits, id rules, parameter checks, prices, tokens, console link.

The hook (:mod:`.hook`, the ``anthropic`` SDK), the renderer (:mod:`.requests`) and the result
parser (:mod:`.results`) are imported only when used; this module stays import-light.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.backends.anthropic.connection import CONNECTION_INFO
from airflow_batch_provider.backends.base import Backend, CountableRequest, TokenRules
from airflow_batch_provider.chunking.limits import MB, ProviderLimits

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer
    from airflow_batch_provider.contract import ModelKind, SpecFields
    from airflow_batch_provider.descriptors import ResultRecord

# Custom ids must match [a-zA-Z0-9_-]{1,64}: other user ids are rewritten to h-<sha256> at chunk time.
ANTHROPIC_LIMITS = ProviderLimits(
    provider="anthropic",
    max_requests=100_000,
    max_bytes=256 * MB,
    default_byte_cap=240 * MB,
    endpoints=frozenset({"/v1/messages"}),
    custom_id_pattern=re.compile(r"[a-zA-Z0-9_-]{1,64}"),
)

# Keys the renderer writes itself; a caller setting them in ``params`` is a mistake.
_RESERVED = frozenset({"model", "messages", "system", "stream"})
_CLAUDE = re.compile(r"^(?:ft:)?claude-", re.IGNORECASE)
# OpenAI-only parameters the Messages API rejects; failing here beats an "errored" result a day later.
_UNSUPPORTED = frozenset(
    {
        "seed",
        "response_format",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "max_completion_tokens",
        "user",
    }
)
TOKENS_PER_MESSAGE = 3
# Anthropic publishes no offline tokenizer; Claude tokens run a little shorter than OpenAI's, and
# the Claude 5 generation's new tokenizer is reported to give ~30% more tokens for the same text.
CHARS_PER_TOKEN = 3.5
_NEW_TOKENIZER = ("claude-sonnet-5", "claude-opus-5", "claude-fable", "claude-mythos", "claude-haiku-5")
_NEW_TOKENIZER_CHARS_PER_TOKEN = 2.7


# Prompt caching: the default TTL suits batches (they may take hours), what a write costs per TTL, and
# the shortest prefix each model caches (a shorter one is processed uncached; the breakpoint is harmless).
DEFAULT_CACHE_TTL = "1h"
CACHE_WRITE_MULTIPLIERS = {"5m": 1.25, "1h": 2.0}
_CACHE_MINIMUM = (
    ("claude-opus-4-1", 1024),
    ("claude-opus-4-0", 1024),
    ("claude-sonnet-4-5", 1024),
    ("claude-sonnet-4-0", 1024),
    ("claude-sonnet-4-6", 2048),  # 2,048 per one source, 1,024 per another: the safe side
    ("claude-sonnet-5", 1024),
    ("claude-opus-5", 512),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)
# Opus 4.5/4.6/4.7 and Haiku 4.5 need 4,096; a model not listed is assumed to need as many (the safe side).
_CACHE_MINIMUM_DEFAULT = 4096


def cache_minimum_tokens(model: str) -> int:
    """Return the fewest prefix tokens ``model`` caches (Anthropic's per-model minimum)."""
    name = model.removeprefix("ft:")
    return next((tokens for prefix, tokens in _CACHE_MINIMUM if name.startswith(prefix)), _CACHE_MINIMUM_DEFAULT)


def check_messages_params(spec: SpecFields, reserved: frozenset[str] = _RESERVED) -> None:
    """Check ``spec.params`` for a Messages API body (Anthropic's API, and Claude on Bedrock)."""
    from airflow_batch_provider.exceptions import InvalidInputError
    from airflow_batch_provider.utils.checks import check_int

    bad = sorted(reserved & spec.params.keys())
    if bad:
        hint = " (use system_prompt for 'system')" if "system" in bad else ""
        raise InvalidInputError(f"params may not set {bad}: the request renderer writes these itself{hint}.")
    unsupported = sorted(_UNSUPPORTED & spec.params.keys())
    if unsupported:
        raise InvalidInputError(f"The Anthropic Messages API does not accept the parameter(s) {unsupported}.")
    max_tokens = spec.params.get("max_tokens")
    if max_tokens is None:
        raise InvalidInputError("Anthropic requests require params['max_tokens'] (a positive integer).")
    check_int("params['max_tokens']", max_tokens, 1)
    if "stop" in spec.params and "stop_sequences" in spec.params:
        raise InvalidInputError("Pass either params['stop'] or params['stop_sequences'], not both.")
    if spec.json_schema is not None and ({"tools", "tool_choice"} & spec.params.keys()):
        raise InvalidInputError("response_schema sets tools and tool_choice itself; remove them from params.")


def claude_token_rules(model: str) -> TokenRules:
    """Return the characters-per-token approximation of a Claude model (by its name)."""
    return TokenRules(_NEW_TOKENIZER_CHARS_PER_TOKEN if model.startswith(_NEW_TOKENIZER) else CHARS_PER_TOKEN)


class AnthropicBackend(Backend):
    """Anthropic Message Batches: ``{custom_id, params}`` lines sent inline, 100,000 requests a batch."""

    name = "anthropic"
    title = "Anthropic Message Batches"
    limits = ANTHROPIC_LIMITS
    endpoints = ("/v1/messages",)
    hook_class_path = "airflow_batch_provider.backends.anthropic.hook:AnthropicBatchHook"
    connection_type = "anthropic_batch"
    sdk_module = "anthropic"
    sdk_requirement = "airflow-batch-provider[anthropic]"
    default_model = "claude-haiku-4-5"
    model_prefixes = ("claude",)
    prices_source = "Anthropic's pricing and model pages (platform.claude.com/docs/en/about-claude/pricing)"
    # Real-time list prices, USD per 1M tokens (input, output); Message Batches halve them.
    # (claude-sonnet-4-5 is left out: it reaches end of life on 2026-11-30.)
    prices = {
        "claude-haiku-4-5": (1.00, 5.00),
        "claude-sonnet-4-6": (3.00, 15.00),
        "claude-sonnet-5": (2.00, 10.00),
        "claude-opus-4-1": (15.00, 75.00),
        "claude-opus-4-5": (5.00, 25.00),
        "claude-opus-4-6": (5.00, 25.00),
        "claude-opus-4-7": (5.00, 25.00),
    }
    # Cache reads 0.1x input; writes 2x with the 1-hour TTL (the batch default; 1.25x with "5m"), and
    # Message Batches' 50% applies on top (platform.claude.com/docs/en/build-with-claude/prompt-caching).
    cache_price_multipliers = (0.1, CACHE_WRITE_MULTIPLIERS[DEFAULT_CACHE_TTL])
    chat_format_tokens = (TOKENS_PER_MESSAGE, 0)
    console_hosts = ("api.anthropic.com",)
    console_template = "https://console.anthropic.com/workspaces/default/batches/{batch_id}"
    # error.error.type of an errored result that a later batch may get answered.
    retryable_line_errors = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})

    def check_params(self, spec: SpecFields) -> None:
        """Require ``max_tokens``; reject OpenAI-only parameters and keys the renderer writes."""
        check_messages_params(spec)

    def model_kind(self, model: str) -> ModelKind | None:
        """Return "chat" for a Claude model (``claude-*``, a fine-tune too): Anthropic has no embedding models."""
        return "chat" if _CLAUDE.match(model) and "embed" not in model.lower() else None

    def renderer(self, spec: SpecFields) -> RequestRenderer:
        """Return the Message Batches line renderer."""
        from airflow_batch_provider.backends.anthropic.requests import AnthropicRenderer

        return AnthropicRenderer(spec)

    def parse_result(self, line: bytes | str | Mapping[str, Any]) -> ResultRecord:
        """Parse one Message Batches result (a JSONL line or the decoded object)."""
        import orjson

        from airflow_batch_provider.backends.anthropic.results import parse_anthropic_result

        return parse_anthropic_result(dict(line) if isinstance(line, Mapping) else orjson.loads(line))

    def connection_info(self) -> dict[str, Any]:
        """Return the ``anthropic_batch`` connection type (API key, base URL)."""
        return CONNECTION_INFO

    def token_rules(self, model: str) -> TokenRules:
        """Return the Claude approximation (no offline tokenizer exists)."""
        return claude_token_rules(model)

    def countable_request(self, line: Mapping[str, Any]) -> CountableRequest | None:
        """Return the ``params`` of a ``{custom_id, params}`` line."""
        params = line.get("params")
        return CountableRequest(params, TOKENS_PER_MESSAGE, 0) if isinstance(params, Mapping) else None
