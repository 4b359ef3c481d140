"""Anthropic Message Batches request lines: ``{custom_id, params}``."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.chunking.requests import RequestRenderer


class AnthropicRenderer(RequestRenderer):
    """Render Anthropic Message Batches lines: ``{custom_id, params}``."""

    provider = "anthropic"

    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first."""
        spec = self.spec
        extra = dict(spec.params)
        params: dict[str, Any] = {"model": spec.model, "max_tokens": extra.pop("max_tokens")}
        if spec.system_prompt is not None:
            params["system"] = spec.system_prompt
        params["messages"] = [{"role": "user", "content": text}]
        stop = extra.pop("stop", None)
        if stop is not None:
            extra["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        params.update(extra)
        if spec.json_schema is not None:
            name = spec.schema_name
            description = spec.json_schema.get("description") or f"Record the answer as a {name} object."
            params["tools"] = [{"name": name, "description": description, "input_schema": spec.json_schema}]
            params["tool_choice"] = {"type": "tool", "name": name}
        return {"custom_id": custom_id, "params": params}
