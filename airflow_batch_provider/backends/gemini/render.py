"""Gemini request lines: ``{"custom_id": ..., "request": GenerateContentRequest}``, one per row.

Parameters are checked and translated in :mod:`.params`. The chunk file keeps ``custom_id`` as the
first key like every other provider's file (line retries, incremental runs and token estimates
read it that way); the hook renames it to the batch API's ``key`` while uploading
(:func:`~.hook.key_line`). The request body is REST JSON (camelCase): ``systemInstruction``,
``contents`` (one user turn) and ``generationConfig``. Structured output (``response_schema``) is
sent as ``responseMimeType: application/json`` plus the JSON Schema in ``responseJsonSchema``; a
caller who wants the older OpenAPI-style ``responseSchema`` passes it (and the MIME type) in
``params`` instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_batch_provider.backends.gemini.limits import PROVIDER
from airflow_batch_provider.backends.gemini.params import REQUEST_FIELDS, generation_config
from airflow_batch_provider.chunking.requests import RequestRenderer

if TYPE_CHECKING:
    from airflow_batch_provider.contract import SpecFields


class GeminiRenderer(RequestRenderer):
    """Render Gemini batch lines ``{custom_id, request}`` (``request`` a REST GenerateContentRequest)."""

    provider: ClassVar[str] = PROVIDER

    def __init__(self, spec: SpecFields) -> None:
        self._config = generation_config(spec)
        self._extra = {name: spec.params[name] for name in sorted(REQUEST_FIELDS & spec.params.keys())}
        super().__init__(spec)

    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first and the user text before anything per-job."""
        request: dict[str, Any] = {}
        if self.spec.system_prompt is not None:
            request["systemInstruction"] = {"parts": [{"text": self.spec.system_prompt}]}
        request["contents"] = [{"role": "user", "parts": [{"text": text}]}]
        if self._config:
            request["generationConfig"] = self._config
        request.update(self._extra)
        return {"custom_id": custom_id, "request": request}
