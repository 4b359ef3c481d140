"""Gemini request lines: ``{"custom_id": ..., "request": GenerateContentRequest}``, one per row.

The chunk file keeps ``custom_id`` as the first key like every other provider's file (line
retries, incremental runs and token estimates read it that way); the hook renames it to the
batch API's ``key`` while uploading (:func:`~.hook.key_line`). The request body is REST JSON
(camelCase): ``systemInstruction``, ``contents`` (one user turn) and ``generationConfig``.

Sampling parameters may be given under the names the other backends use and are translated
(``max_tokens`` → ``maxOutputTokens``, ``top_p`` → ``topP``, ``stop`` → ``stopSequences`` ...), or
under Gemini's own ``generationConfig`` names. Structured output (``response_schema``) is sent as
``responseMimeType: application/json`` plus the JSON Schema in ``responseJsonSchema``; a caller who
wants the older OpenAPI-style ``responseSchema`` passes it (and the MIME type) in ``params`` instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_batch_provider.backends.gemini.limits import PROVIDER
from airflow_batch_provider.chunking.requests import RequestRenderer
from airflow_batch_provider.exceptions import InvalidInputError

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.spec import RequestSpec

#: The other backends' parameter names and their generationConfig names.
TRANSLATED = {
    "max_tokens": "maxOutputTokens",
    "max_output_tokens": "maxOutputTokens",
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "stop": "stopSequences",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}
#: generationConfig fields passed through under their own names.
GENERATION_CONFIG = frozenset(
    {
        "maxOutputTokens",
        "temperature",
        "topP",
        "topK",
        "stopSequences",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "candidateCount",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "responseLogprobs",
        "logprobs",
        "thinkingConfig",
        "mediaResolution",
    }
)
#: GenerateContentRequest fields next to generationConfig that a caller may set.
REQUEST_FIELDS = frozenset({"safetySettings", "tools", "toolConfig", "cachedContent"})
_RESERVED = frozenset({"model", "contents", "systemInstruction", "system", "messages", "stream", "generationConfig"})
_SCHEMA_KEYS = frozenset({"responseMimeType", "responseSchema", "responseJsonSchema"})
# Model families of the other backends: a chunk for them sent to Gemini fails only when the batch runs.
_FOREIGN_MODELS = ("gpt-", "chatgpt-", "o1", "o3", "o4", "claude-", "anthropic.", "amazon.", "text-embedding")


def check_gemini_params(spec: RequestSpec) -> None:
    """Raise InvalidInputError for a model or ``params`` the Gemini batch API would reject (before any upload)."""
    if spec.model.startswith(_FOREIGN_MODELS):
        raise InvalidInputError(
            f"Model {spec.model!r} is not a Gemini model; with provider 'gemini' use one such as "
            "'gemini-2.5-flash' (or pick the provider that serves this model)."
        )
    params = spec.params
    reserved = sorted(_RESERVED & params.keys())
    if reserved:
        raise InvalidInputError(
            f"params may not set {reserved}: the Gemini renderer writes these itself "
            "(use system_prompt for the system instruction; sampling parameters go in params directly)."
        )
    known = TRANSLATED.keys() | GENERATION_CONFIG | REQUEST_FIELDS
    unknown = sorted(params.keys() - known)
    if unknown:
        raise InvalidInputError(
            f"The Gemini batch API does not take the parameter(s) {unknown}; accepted: {sorted(known)}."
        )
    targets: dict[str, str] = {}
    for name in params:
        target = TRANSLATED.get(name, name)
        if target in targets:
            raise InvalidInputError(f"params {targets[target]!r} and {name!r} both set {target!r}; pass one.")
        targets[target] = name
    max_tokens = params.get(targets.get("maxOutputTokens", ""))
    if "maxOutputTokens" in targets and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        name = targets["maxOutputTokens"]
        raise InvalidInputError(f"params[{name!r}] must be a positive integer, got {max_tokens!r}.")
    if spec.json_schema is not None and _SCHEMA_KEYS & targets.keys():
        raise InvalidInputError(
            "response_schema sets responseMimeType and responseJsonSchema itself; remove "
            f"{sorted(_SCHEMA_KEYS & targets.keys())} from params (or drop response_schema)."
        )


def generation_config(spec: RequestSpec) -> dict[str, Any]:
    """Return the request's ``generationConfig`` from ``spec.params`` and its response schema."""
    config: dict[str, Any] = {}
    for name, value in spec.params.items():
        if name in REQUEST_FIELDS:
            continue
        target = TRANSLATED.get(name, name)
        if target == "stopSequences" and isinstance(value, str):
            value = [value]
        config[target] = value
    if spec.json_schema is not None:
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = spec.json_schema
    return config


class GeminiRenderer(RequestRenderer):
    """Render Gemini batch lines ``{custom_id, request}`` (``request`` a REST GenerateContentRequest)."""

    provider: ClassVar[str] = PROVIDER

    def __init__(self, spec: RequestSpec) -> None:
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
