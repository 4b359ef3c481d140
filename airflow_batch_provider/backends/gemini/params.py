"""Gemini request parameters: which ``params`` a Gemini request takes, checked before anything is written.

Sampling parameters may be given under the names the other backends use and are translated
(``max_tokens`` → ``maxOutputTokens``, ``top_p`` → ``topP``, ``stop`` → ``stopSequences`` ...), or
under Gemini's own ``generationConfig`` names; a few request-level fields (``safetySettings``,
``tools``, ``toolConfig``, ``cachedContent``) pass through. Imports nothing of the chunk step, so
:class:`~airflow_batch_provider.chunking.spec.RequestSpec` can call :func:`check_gemini_params`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_batch_provider.backends.gemini.limits import PROVIDER
from airflow_batch_provider.backends.registry import backend_for_model
from airflow_batch_provider.exceptions import InvalidInputError

if TYPE_CHECKING:
    from airflow_batch_provider.contract import SpecFields

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


def check_gemini_params(spec: SpecFields) -> None:
    """Raise InvalidInputError for a model or ``params`` the Gemini batch API would reject (before any upload)."""
    # Another backend's model sent to Gemini would fail only when the batch runs, a day later.
    owner = backend_for_model(spec.model)
    if owner is not None and owner.name != PROVIDER:
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


def generation_config(spec: SpecFields) -> dict[str, Any]:
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
