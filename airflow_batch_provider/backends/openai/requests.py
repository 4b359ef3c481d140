"""OpenAI Batch API request lines: ``{custom_id, method, url, body}``."""

from __future__ import annotations

from typing import Any

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
        return {"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}
