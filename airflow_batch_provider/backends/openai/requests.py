"""OpenAI Batch API request lines: ``{custom_id, method, url, body}``.

Prompt caching is automatic at OpenAI for prompts of 1,024 tokens or more, on their prefix: the
system prompt comes first and the row's text last. A chat request whose shared prefix (system
prompt and response format) is that long also carries ``prompt_cache_key``, a hash of that prefix,
so requests of one job are routed to the same cache (docs/cost.md, "Prompt caching").
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import orjson

from airflow_batch_provider.chunking.requests import RequestRenderer
from airflow_batch_provider.chunking.spec import strict_json_schema
from airflow_batch_provider.contract import COMPLETIONS, EMBEDDINGS, SpecFields


class OpenAIRenderer(RequestRenderer):
    """Render OpenAI Batch API lines: ``{custom_id, method, url, body}``."""

    provider = "openai"

    def __init__(self, spec: SpecFields) -> None:
        self._response_format: dict[str, Any] | None = None
        if spec.json_schema is not None:
            schema = strict_json_schema(spec.json_schema) if spec.schema_from_model else spec.json_schema
            self._response_format = {
                "type": "json_schema",
                "json_schema": {"name": spec.schema_name, "schema": schema, "strict": True},
            }
        super().__init__(spec)

    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first."""
        spec = self.spec
        body: dict[str, Any] = {"model": spec.model}
        if self.endpoint == EMBEDDINGS:
            body["input"] = text
        elif self.endpoint == COMPLETIONS:
            body["prompt"] = text
        else:
            messages: list[dict[str, str]] = []
            if spec.system_prompt is not None:
                messages.append({"role": "system", "content": spec.system_prompt})
            messages.append({"role": "user", "content": text})
            body["messages"] = messages
        body.update(spec.params)
        if self._response_format is not None:
            body["response_format"] = self._response_format
        if self._prompt_cache_key is not None and "prompt_cache_key" not in body:
            body["prompt_cache_key"] = self._prompt_cache_key
        return {"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}

    @functools.cached_property
    def _prompt_cache_key(self) -> str | None:
        """A stable key of the job's shared prefix when it is long enough to cache, else None.

        Sent to OpenAI only: an OpenAI-compatible service built on this renderer may refuse the field.
        """
        spec = self.spec
        if self.provider != "openai" or spec.prompt_caching is False or self.endpoint in (EMBEDDINGS, COMPLETIONS):
            return None
        prefix = orjson.dumps([spec.model, spec.system_prompt, self._response_format])
        if math.ceil(len(prefix) / CHARS_PER_TOKEN) < MIN_CACHED_PROMPT_TOKENS:
            return None
        return "abp-" + hashlib.sha256(prefix).hexdigest()[:32]


MIN_CACHED_PROMPT_TOKENS = 1024  # OpenAI caches prompts of 1,024 tokens and more
CHARS_PER_TOKEN = 4.0  # OpenAI's rule of thumb: deciding whether to send a key needs no tokenizer
