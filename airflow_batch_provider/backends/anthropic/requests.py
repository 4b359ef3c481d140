"""Anthropic Message Batches request lines: ``{custom_id, params}``.

Prompt caching: the shared prefix (tools, then the system prompt; the row's text is the user
message, after it) gets one ``cache_control`` breakpoint when it is long enough for the model's
cache (:func:`~airflow_batch_provider.backends.anthropic.cache_minimum_tokens`), counted as the cost
estimate counts Claude tokens. A shorter prefix is sent as before, byte for byte.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import orjson

from airflow_batch_provider.backends.anthropic import DEFAULT_CACHE_TTL, cache_minimum_tokens, claude_token_rules
from airflow_batch_provider.chunking.requests import RequestRenderer


class AnthropicRenderer(RequestRenderer):
    """Render Anthropic Message Batches lines: ``{custom_id, params}``."""

    provider = "anthropic"

    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first."""
        spec = self.spec
        extra = dict(spec.params)
        params: dict[str, Any] = {"model": spec.model, "max_tokens": extra.pop("max_tokens")}
        breakpoint_ = self._cache_control
        if spec.system_prompt is not None:
            params["system"] = spec.system_prompt
            if breakpoint_ is not None:
                params["system"] = [{"type": "text", "text": spec.system_prompt, "cache_control": breakpoint_}]
        params["messages"] = [{"role": "user", "content": text}]
        stop = extra.pop("stop", None)
        if stop is not None:
            extra["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        params.update(extra)
        tool = self._tool
        if tool is not None:
            if breakpoint_ is not None and spec.system_prompt is None:  # the tool is the whole shared prefix
                tool = {**tool, "cache_control": breakpoint_}
            params["tools"] = [tool]
            params["tool_choice"] = {"type": "tool", "name": tool["name"]}
        return {"custom_id": custom_id, "params": params}

    @functools.cached_property
    def _tool(self) -> dict[str, Any] | None:
        """The forced tool carrying the response schema (None without one)."""
        spec = self.spec
        if spec.json_schema is None:
            return None
        name = spec.schema_name
        description = spec.json_schema.get("description") or f"Record the answer as a {name} object."
        return {"name": name, "description": description, "input_schema": spec.json_schema}

    @functools.cached_property
    def prefix_tokens(self) -> int:
        """Tokens of the shared prefix every request repeats: the tool definition and the system prompt."""
        chars_per_token = claude_token_rules(self.spec.model).chars_per_token
        pieces = [self.spec.system_prompt or "", orjson.dumps(self._tool).decode() if self._tool else ""]
        return sum(math.ceil(len(piece) / chars_per_token) for piece in pieces)

    @functools.cached_property
    def _cache_control(self) -> dict[str, str] | None:
        """The breakpoint to put on the shared prefix, or None (caching off, or the prefix too short)."""
        setting = self.spec.prompt_caching
        if setting is False or self.prefix_tokens < cache_minimum_tokens(self.spec.model):
            return None
        return {"type": "ephemeral", "ttl": DEFAULT_CACHE_TTL if setting is True else str(setting)}

    @property
    def cache_note(self) -> str | None:
        """Say, for the chunk log, why the shared prefix is not cached (None when it is, or caching is off)."""
        if self.spec.prompt_caching is False or self._cache_control is not None:
            return None
        need = cache_minimum_tokens(self.spec.model)
        return (
            f"prompt caching: the shared prefix (system prompt and schema) has ~{self.prefix_tokens:,} tokens; "
            f"{self.spec.model} caches prefixes of {need:,} or more, so every request pays full input price for it"
        )
