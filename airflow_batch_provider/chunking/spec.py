"""The provider-neutral request spec: what to ask every row, checked before anything is written.

A :class:`RequestSpec` says what to ask (provider, endpoint, model, system prompt, sampling
parameters, optional structured-output schema). Its provider's backend checks the parameters
(:meth:`~airflow_batch_provider.backends.base.Backend.check_params`) and renders it into the
provider's wire format (:func:`renderer_for`). Backends read it through
:class:`~airflow_batch_provider.contract.SpecFields`, so the backend contract never imports this module.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from airflow_batch_provider.backends.registry import get_backend
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.chunking.validation import check_model_endpoint
from airflow_batch_provider.contract import COMPLETIONS, EMBEDDINGS
from airflow_batch_provider.exceptions import InvalidInputError

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.requests import RequestRenderer

_SCHEMA_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def default_endpoint(provider: str) -> str:
    """Return the endpoint used when none is given (the backend's first, e.g. chat completions)."""
    return get_backend(provider).default_endpoint


def check_endpoint(provider: str, endpoint: str) -> None:
    """Raise InvalidInputError unless ``provider`` can render requests for ``endpoint``."""
    accepted = get_backend(provider).endpoints
    if endpoint not in accepted:
        raise InvalidInputError(
            f"Endpoint {endpoint!r} is not supported for provider {provider!r}; accepted: {', '.join(accepted)}."
        )


@dataclass(frozen=True)
class RequestSpec:
    """What to ask for every row: provider, endpoint, model, system prompt, params, output schema.

    ``params`` are passed through into the request body (``max_tokens``, ``temperature``,
    ``top_p``, ``stop``, ``seed``, ``response_format`` ...); for Anthropic ``max_tokens`` is
    required and ``stop`` is sent as ``stop_sequences``. ``response_schema`` (a JSON Schema
    dict or a pydantic model class) asks for structured output: OpenAI gets a strict
    ``json_schema`` response format, Anthropic a forced tool call. It is normalised into
    :attr:`json_schema` and :attr:`schema_name`. Invalid combinations raise InvalidInputError
    on construction, including a model whose name says it cannot serve the endpoint (an
    embedding model on chat, a chat model on embeddings; see
    :func:`~airflow_batch_provider.chunking.validation.check_model_endpoint`). ``endpoint`` is
    one of the backend's ``endpoints``; left out (or empty) it is set to the backend's first.
    ``prompt_caching`` (default True) lets the backend mark the shared prefix (system prompt and
    schema) for the provider's prompt cache when it is long enough; a TTL string ("5m", "1h") sets
    Anthropic's cache lifetime; False sends every request without (see docs/cost.md).
    """

    provider: str
    model: str
    endpoint: str = ""
    system_prompt: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    response_schema: Mapping[str, Any] | type[Any] | None = None
    prompt_caching: bool | str = True
    json_schema: dict[str, Any] | None = field(init=False, default=None, compare=False)
    schema_name: str | None = field(init=False, default=None, compare=False)
    schema_from_model: bool = field(init=False, default=False, compare=False)

    def __post_init__(self) -> None:
        backend = get_backend(self.provider)  # an unknown provider fails here, naming the known ones
        endpoint = self.endpoint or backend.default_endpoint
        check_endpoint(self.provider, endpoint)
        object.__setattr__(self, "endpoint", endpoint)
        if not isinstance(self.model, str) or not self.model.strip():
            raise InvalidInputError(f"model must be a non-empty string, got {self.model!r}.")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise InvalidInputError(f"system_prompt must be a string or None, got {type(self.system_prompt).__name__}.")
        object.__setattr__(self, "params", _copy_params(self.params))
        check_prompt_caching(self.prompt_caching)
        if self.system_prompt is not None and endpoint in (EMBEDDINGS, COMPLETIONS):
            raise InvalidInputError(
                f"The {endpoint} endpoint takes no system prompt; put the instructions into the prompt template."
            )
        if self.response_schema is not None:
            if endpoint in (EMBEDDINGS, COMPLETIONS):
                raise InvalidInputError(f"The {endpoint} endpoint does not support a response_schema.")
            schema, name, from_model = _normalise_schema(self.response_schema)
            object.__setattr__(self, "json_schema", schema)
            object.__setattr__(self, "schema_name", name)
            object.__setattr__(self, "schema_from_model", from_model)
        backend.check_params(self)
        check_model_endpoint(self.model, endpoint)

    @property
    def limits(self) -> ProviderLimits:
        """Return the provider's batch limits."""
        return get_backend(self.provider).limits


CACHE_TTLS = ("5m", "1h")


def check_prompt_caching(value: Any) -> None:
    """Raise InvalidInputError unless ``value`` is True, False or a cache TTL (Anthropic's "5m" or "1h")."""
    if not isinstance(value, bool) and value not in CACHE_TTLS:
        raise InvalidInputError(
            f"prompt_caching must be True (cache the shared prefix where it pays), False (never), or an "
            f"Anthropic cache TTL {' or '.join(map(repr, CACHE_TTLS))}; got {value!r}."
        )


def renderer_for(spec: RequestSpec) -> RequestRenderer:
    """Return the renderer of ``spec``'s provider (its backend's, see :mod:`airflow_batch_provider.backends`)."""
    return get_backend(spec.provider).renderer(spec)


def _copy_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return a private, JSON-clean copy of ``params`` (rejecting values JSON cannot carry)."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InvalidInputError(f"params must be a mapping, got {type(params).__name__}.")
    clean: dict[str, Any] = {}
    for key, value in params.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"params keys must be strings, got {key!r}.")
        try:
            clean[key] = orjson.loads(orjson.dumps(value))
        except TypeError as err:
            raise InvalidInputError(f"params[{key!r}] is not JSON-serialisable: {err}.") from None
    return clean


def _normalise_schema(schema: Mapping[str, Any] | type[Any]) -> tuple[dict[str, Any], str, bool]:
    """Return (JSON Schema dict, name usable as OpenAI schema / Anthropic tool name, came from pydantic)."""
    from_model = False
    if isinstance(schema, type):
        import pydantic

        if not issubclass(schema, pydantic.BaseModel):
            raise InvalidInputError(f"response_schema must be a JSON Schema dict or a pydantic model, got {schema!r}.")
        json_schema = schema.model_json_schema()
        raw_name = schema.__name__
        from_model = True
    elif isinstance(schema, Mapping):
        json_schema = copy.deepcopy(dict(schema))
        raw_name = str(json_schema.get("title") or "response")
    else:
        raise InvalidInputError(
            f"response_schema must be a JSON Schema dict or a pydantic model, got {type(schema).__name__}."
        )
    import jsonschema

    try:
        jsonschema.validators.validator_for(json_schema).check_schema(json_schema)
    except jsonschema.SchemaError as err:
        raise InvalidInputError(f"response_schema is not a valid JSON Schema: {err.message}.") from None
    if json_schema.get("type") != "object":
        raise InvalidInputError(
            f"response_schema must describe a JSON object (type 'object'), got type {json_schema.get('type')!r}."
        )
    name = _SCHEMA_NAME_BAD_CHARS.sub("_", raw_name)[:64] or "response"
    return json_schema, name, from_model


def strict_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``schema`` that OpenAI's strict structured outputs accept.

    Objects get ``additionalProperties: false`` and every property becomes required (optional
    pydantic fields stay nullable), ``None`` defaults are dropped and ``$ref`` with sibling keys
    is inlined — the same rules the OpenAI SDK applies to pydantic models.
    """
    root = copy.deepcopy(dict(schema))
    return _strictify(root, root)


def _strictify_children(node: dict[str, Any], root: dict[str, Any]) -> None:
    """Make every sub-schema of ``node`` strict: definitions, properties, items, anyOf/allOf."""
    for defs_key in ("$defs", "definitions"):
        defs = node.get(defs_key)
        if isinstance(defs, dict):
            for sub in defs.values():
                if isinstance(sub, dict):
                    _strictify(sub, root)
    properties = node.get("properties")
    if isinstance(properties, dict):
        node["properties"] = {k: _strictify(v, root) if isinstance(v, dict) else v for k, v in properties.items()}
    if isinstance(node.get("items"), dict):
        node["items"] = _strictify(node["items"], root)
    for key in ("anyOf", "allOf"):
        if isinstance(node.get(key), list):
            node[key] = [_strictify(v, root) if isinstance(v, dict) else v for v in node[key]]


def _strictify(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    _strictify_children(node, root)
    if node.get("type") == "object" and "additionalProperties" not in node:
        node["additionalProperties"] = False
    properties = node.get("properties")
    if isinstance(properties, dict):
        node["required"] = list(properties)
    if "default" in node and node["default"] is None:
        del node["default"]
    ref = node.get("$ref")
    if isinstance(ref, str) and len(node) > 1 and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        merged = {**copy.deepcopy(target), **node}
        del merged["$ref"]
        return _strictify(merged, root)
    return node
