"""The provider-neutral request spec and the renderers that turn it into wire-format lines.

A :class:`RequestSpec` says what to ask (provider, endpoint, model, system prompt, sampling
parameters, optional structured-output schema). A renderer turns one ``(custom_id, user_text)``
pair into one JSONL line in the provider's batch format.

Rendering is on the hot path (millions of rows), so a renderer serialises the full request
once with two sentinel strings in place of the custom id and the user text, splits the bytes
at the sentinels, and per row only splices in ``orjson.dumps(custom_id)`` and
``orjson.dumps(text)`` (each a correctly escaped JSON string). :meth:`RequestRenderer.render_arrays`
does the same for a whole record batch with Arrow kernels (ids and texts escaped exactly as orjson
does it, see :func:`~airflow_batch_provider.chunking.arrow_text.json_escape`), leaving only the per-row
sha256 of the fingerprint in Python.
:meth:`RequestRenderer.request_dict` builds the same request as a plain dict; it is the single
source of truth and what the tests compare against.
"""

from __future__ import annotations

import copy
import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import orjson
import pyarrow as pa

from airflow_batch_provider.chunking.arrow_text import concat, json_escape
from airflow_batch_provider.chunking.limits import ProviderLimits, limits_for
from airflow_batch_provider.chunking.validation import check_model_endpoint
from airflow_batch_provider.exceptions import InvalidInputError

CHAT_COMPLETIONS = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"

#: Endpoints each provider's renderer can write, in the order error messages list them.
SUPPORTED_ENDPOINTS: dict[str, tuple[str, ...]] = {
    "openai": (CHAT_COMPLETIONS, EMBEDDINGS, COMPLETIONS),
    "anthropic": (MESSAGES,),
}
DEFAULT_ENDPOINTS: dict[str, str] = {"openai": CHAT_COMPLETIONS, "anthropic": MESSAGES}

# Keys the renderer writes itself; a caller setting them in ``params`` is a mistake.
_OPENAI_RESERVED = frozenset({"model", "messages", "input", "prompt", "stream"})
_ANTHROPIC_RESERVED = frozenset({"model", "messages", "system", "stream"})
# OpenAI-only parameters the Messages API rejects; failing here beats an "errored" result a day later.
_ANTHROPIC_UNSUPPORTED = frozenset(
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
_SCHEMA_NAME_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def default_endpoint(provider: str) -> str:
    """Return the endpoint used when none is given (chat completions / messages)."""
    limits_for(provider)
    return DEFAULT_ENDPOINTS[provider]


def check_endpoint(provider: str, endpoint: str) -> None:
    """Raise InvalidInputError unless ``provider`` can render requests for ``endpoint``."""
    limits_for(provider)
    accepted = SUPPORTED_ENDPOINTS[provider]
    if endpoint not in accepted:
        raise InvalidInputError(
            f"Endpoint {endpoint!r} is not supported for provider {provider!r}; accepted: {', '.join(accepted)}."
        )


def request_fingerprint(request_without_id: bytes, *, provider: str, endpoint: str) -> str:
    """Return a 32-hex-char sha256 of one request, independent of its custom_id.

    ``request_without_id`` is the orjson encoding of the request dict without its
    ``custom_id`` key; the same prompt to the same model and endpoint gives the same
    fingerprint whatever the id, so later steps can detect repeated work.
    """
    digest = hashlib.sha256(f"{provider}\n{endpoint}\n".encode())
    digest.update(request_without_id)
    return digest.hexdigest()[:32]


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
    :func:`~airflow_batch_provider.chunking.validation.check_model_endpoint`).
    """

    provider: str
    model: str
    endpoint: str | None = None
    system_prompt: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    response_schema: Mapping[str, Any] | type[Any] | None = None
    json_schema: dict[str, Any] | None = field(init=False, default=None, compare=False)
    schema_name: str | None = field(init=False, default=None, compare=False)
    schema_from_model: bool = field(init=False, default=False, compare=False)

    def __post_init__(self) -> None:
        limits_for(self.provider)
        endpoint = self.endpoint or DEFAULT_ENDPOINTS[self.provider]
        check_endpoint(self.provider, endpoint)
        object.__setattr__(self, "endpoint", endpoint)
        if not isinstance(self.model, str) or not self.model.strip():
            raise InvalidInputError(f"model must be a non-empty string, got {self.model!r}.")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise InvalidInputError(f"system_prompt must be a string or None, got {type(self.system_prompt).__name__}.")
        object.__setattr__(self, "params", _copy_params(self.params))
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
        if self.provider == "openai":
            self._check_openai_params()
        else:
            self._check_anthropic_params()
        check_model_endpoint(self.model, endpoint)

    @property
    def limits(self) -> ProviderLimits:
        """Return the provider's batch limits."""
        return limits_for(self.provider)

    def _check_openai_params(self) -> None:
        bad = sorted(_OPENAI_RESERVED & self.params.keys())
        if bad:
            raise InvalidInputError(f"params may not set {bad}: the request renderer writes these itself.")
        if self.json_schema is not None and "response_format" in self.params:
            raise InvalidInputError("Pass either response_schema or params['response_format'], not both.")

    def _check_anthropic_params(self) -> None:
        bad = sorted(_ANTHROPIC_RESERVED & self.params.keys())
        if bad:
            hint = " (use system_prompt for 'system')" if "system" in bad else ""
            raise InvalidInputError(f"params may not set {bad}: the request renderer writes these itself{hint}.")
        unsupported = sorted(_ANTHROPIC_UNSUPPORTED & self.params.keys())
        if unsupported:
            raise InvalidInputError(f"The Anthropic Messages API does not accept the parameter(s) {unsupported}.")
        max_tokens = self.params.get("max_tokens")
        if max_tokens is None:
            raise InvalidInputError("Anthropic requests require params['max_tokens'] (a positive integer).")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidInputError(f"params['max_tokens'] must be a positive integer, got {max_tokens!r}.")
        if "stop" in self.params and "stop_sequences" in self.params:
            raise InvalidInputError("Pass either params['stop'] or params['stop_sequences'], not both.")
        if self.json_schema is not None and ({"tools", "tool_choice"} & self.params.keys()):
            raise InvalidInputError("response_schema sets tools and tool_choice itself; remove them from params.")


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


def _strictify(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    for defs_key in ("$defs", "definitions"):
        defs = node.get(defs_key)
        if isinstance(defs, dict):
            for sub in defs.values():
                if isinstance(sub, dict):
                    _strictify(sub, root)
    if node.get("type") == "object" and "additionalProperties" not in node:
        node["additionalProperties"] = False
    properties = node.get("properties")
    if isinstance(properties, dict):
        node["required"] = list(properties)
        node["properties"] = {k: _strictify(v, root) if isinstance(v, dict) else v for k, v in properties.items()}
    if isinstance(node.get("items"), dict):
        node["items"] = _strictify(node["items"], root)
    for key in ("anyOf", "allOf"):
        if isinstance(node.get(key), list):
            node[key] = [_strictify(v, root) if isinstance(v, dict) else v for v in node[key]]
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


class RenderedRequests:
    """The request lines of one record batch, each ending in ``\\n``, in one contiguous Arrow buffer."""

    def __init__(self, lines: pa.Array, fingerprints: pa.Array) -> None:
        self.lines = lines  # large_string
        self.fingerprints = fingerprints  # string, 32 hex chars each
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
        data = lines.buffers()[2]
        self._data = memoryview(data if data is not None else b"")
        self.offsets = offsets  # line i is data[offsets[i]:offsets[i + 1]]
        self.sizes = np.diff(offsets)  # bytes per line, newline included

    def __len__(self) -> int:
        return len(self.lines)

    def data(self, start: int, stop: int) -> memoryview:
        """Return lines ``start`` … ``stop - 1`` as one block of bytes, newlines included."""
        return self._data[int(self.offsets[start]) : int(self.offsets[stop])]


# Sentinels contain NUL, which orjson escapes as \u0000: they cannot collide with ordinary text,
# and the split below checks that each occurs exactly once anyway.
_ID_SENTINEL = "\x00abp-custom-id\x00"
_TEXT_SENTINEL = "\x00abp-user-text\x00"


class RequestRenderer(ABC):
    """Turn ``(custom_id, user_text)`` pairs into one provider's JSONL request lines."""

    provider: ClassVar[str]

    def __init__(self, spec: RequestSpec) -> None:
        if spec.provider != self.provider:
            raise InvalidInputError(f"{type(self).__name__} renders {self.provider!r} requests, not {spec.provider!r}.")
        self.spec = spec
        self.endpoint: str = spec.endpoint or DEFAULT_ENDPOINTS[spec.provider]
        blob = orjson.dumps(self.request_dict(_ID_SENTINEL, _TEXT_SENTINEL))
        head, after_id = _split_once(blob, orjson.dumps(_ID_SENTINEL))
        middle, tail = _split_once(after_id, orjson.dumps(_TEXT_SENTINEL))
        # The line is head + id + middle + text + tail; the id-less request that the fingerprint
        # covers is "{" + middle without its leading comma + text + tail (custom_id is the first key).
        if not head.endswith(b":") or not middle.startswith(b","):
            raise AssertionError("custom_id must be the first key of the request dict")
        self._head = head
        self._middle = middle
        self._tail = tail
        self._fp_base = hashlib.sha256(f"{spec.provider}\n{self.endpoint}\n".encode() + b"{" + middle[1:])

    @abstractmethod
    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first (the reference for :meth:`render`)."""

    def render(self, custom_id: str, text: str) -> bytes:
        """Return one request line (no trailing newline)."""
        return b"".join((self._head, orjson.dumps(custom_id), self._middle, orjson.dumps(text), self._tail))

    def render_many(self, custom_ids: Sequence[str], texts: Sequence[str]) -> tuple[list[bytes], list[str]]:
        """Return the request lines and request fingerprints for parallel lists of ids and texts."""
        head, middle, tail, base = self._head, self._middle, self._tail, self._fp_base
        dumps = orjson.dumps
        lines: list[bytes] = []
        fingerprints: list[str] = []
        add_line, add_fp = lines.append, fingerprints.append
        for custom_id, text in zip(custom_ids, texts, strict=True):
            body = dumps(text) + tail
            add_line(b"".join((head, dumps(custom_id), middle, body)))
            digest = base.copy()
            digest.update(body)
            add_fp(digest.hexdigest()[:32])
        return lines, fingerprints

    def render_arrays(self, custom_ids: pa.Array, json_texts: pa.Array) -> RenderedRequests:
        """Render a batch: the same lines and fingerprints as :meth:`render_many`, built by Arrow kernels.

        ``custom_ids`` is a string array; ``json_texts`` holds each user text as a JSON string
        literal (:meth:`~airflow_batch_provider.chunking.templates.PromptTemplate.render_json`
        or :func:`~airflow_batch_provider.chunking.arrow_text.json_strings`). Neither may hold nulls.
        """
        lines, bodies = self.render_lines(custom_ids, json_texts)
        return RenderedRequests(lines, self.fingerprints(bodies))

    def render_lines(self, custom_ids: pa.Array, json_texts: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Return (request lines, bodies) of a batch: :meth:`render_arrays` without the fingerprints.

        Only Arrow kernels (they release the GIL); :meth:`fingerprints` of the bodies gives the rest.
        """
        # The fingerprint covers the id-less request, which ends with text + tail (see __init__).
        bodies = concat(json_texts, self.body_suffix)
        return self.lines_of(custom_ids, bodies), bodies

    @property
    def body_suffix(self) -> str:
        """What follows the user text in every request: ``render_json(..., suffix=body_suffix)`` gives bodies."""
        return self._tail.decode()

    def lines_of(self, custom_ids: pa.Array, bodies: pa.Array) -> pa.Array:
        """Return the request lines for ``bodies`` (user text as a JSON literal + :attr:`body_suffix`)."""
        if len(custom_ids) != len(bodies):
            raise ValueError(f"{len(custom_ids)} custom ids but {len(bodies)} texts")
        head, middle = self._head.decode(), self._middle.decode()
        return concat(head + '"', json_escape(custom_ids), '"' + middle, bodies, "\n")

    def fingerprints(self, bodies: pa.Array) -> pa.Array:
        """Return the fingerprints of ``bodies`` as a string array (hex of the first 16 digest bytes)."""
        # The sha256 calls are the only per-row Python left (a plain loop is the fastest form);
        # the hex formatting happens once for the whole batch.
        copy = self._fp_base.copy
        digests: list[bytes] = []
        add = digests.append
        for body in bodies.cast(pa.large_binary()).to_pylist():
            sha = copy()
            sha.update(body)
            add(sha.digest())
        first_halves = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 32)[:, :16]
        hexed = first_halves.tobytes().hex().encode()
        offsets = np.arange(0, 32 * len(bodies) + 1, 32, dtype=np.int32)
        return pa.StringArray.from_buffers(len(bodies), pa.py_buffer(offsets), pa.py_buffer(hexed))

    def fingerprint(self, text: str) -> str:
        """Return the request fingerprint of ``text`` (the same for every custom_id)."""
        digest = self._fp_base.copy()
        digest.update(orjson.dumps(text) + self._tail)
        return digest.hexdigest()[:32]


class OpenAIRenderer(RequestRenderer):
    """Render OpenAI Batch API lines: ``{custom_id, method, url, body}``."""

    provider = "openai"

    def __init__(self, spec: RequestSpec) -> None:
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


_RENDERERS: dict[str, type[RequestRenderer]] = {"openai": OpenAIRenderer, "anthropic": AnthropicRenderer}


def renderer_for(spec: RequestSpec) -> RequestRenderer:
    """Return the renderer for ``spec``'s provider."""
    return _RENDERERS[spec.provider](spec)


def _split_once(blob: bytes, marker: bytes) -> tuple[bytes, bytes]:
    before, found, after = blob.partition(marker)
    if not found or marker in after:
        raise InvalidInputError("The request spec contains a reserved internal marker string; remove NUL characters.")
    return before, after
