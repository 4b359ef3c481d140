"""Output tokens of requests: the upper bound, and what a structured answer is expected to use.

``max_tokens`` is a cap: a classifier with ``max_tokens=64`` that answers
``{"label":"electronics","confidence":0.93}`` is billed ~15 output tokens, not 64. When a request
asks for structured output whose size the schema bounds — an OpenAI ``json_schema`` response
format, or the input schema of the tool an Anthropic request forces — :func:`typical_answer`
writes the answer the schema allows, leaning long: the longest ``enum`` label, every property (even
optional ones), a number with two decimals. The token counter then counts that text.

A schema with free text in it (a string with no ``enum``/``const``/``maxLength``, an array with no
``maxItems``, ``$ref``) bounds nothing: :func:`typical_answer` returns None and the expectation
stays at the cap, and says so. So does a request with no schema.

Not modelled: the few tokens a provider adds around a tool call (Anthropic's ``tool_use`` block),
and hidden reasoning tokens of reasoning models, which are billed as output too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

# Output tokens per request when it sets no max_tokens: a guess, not a bound (the basis says so).
DEFAULT_OUTPUT_TOKENS = 256
# Typical values for the scalar types, written the way models write them.
_SCALARS: dict[str, Any] = {"number": 0.93, "integer": 42, "boolean": False, "null": None}
# Strings a `format` fixes the shape of.
_FORMATS = {"date": "2026-01-31", "date-time": "2026-01-31T12:00:00Z", "time": "12:00:00", "uuid": "0" * 36}
_MAX_DEPTH = 16


class _Unbounded(Exception):
    """The schema lets the answer grow without a bound it states."""


def answer_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Return the JSON Schema a request body asks its answer to follow, or None.

    OpenAI: ``response_format = {"type": "json_schema", "json_schema": {"schema": …}}``.
    Anthropic: ``tool_choice = {"type": "tool", "name": N}`` and the ``tools`` entry named N.
    """
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return schema if isinstance(schema, Mapping) else None
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "tool":
        for tool in body.get("tools") or ():
            if isinstance(tool, Mapping) and tool.get("name") == choice.get("name"):
                schema = tool.get("input_schema")
                return schema if isinstance(schema, Mapping) else None
    return None


def typical_answer(schema: Mapping[str, Any]) -> str | None:
    """Return compact JSON of a long-leaning answer ``schema`` allows, or None when it bounds nothing."""
    try:
        return orjson.dumps(_value(schema, 0)).decode()
    except _Unbounded:
        return None


def _value(schema: Any, depth: int) -> Any:
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH or "$ref" in schema:
        raise _Unbounded
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return max(schema["enum"], key=lambda v: len(orjson.dumps(v)))
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return max((_value(o, depth + 1) for o in options), key=lambda v: len(orjson.dumps(v)))
    kind = schema.get("type")
    if isinstance(kind, list):  # e.g. ["string", "null"]: the longest non-null kind
        kinds = [k for k in kind if k != "null"] or ["null"]
        return max((_value({**schema, "type": k}, depth + 1) for k in kinds), key=lambda v: len(orjson.dumps(v)))
    if kind == "object" or "properties" in schema:
        return _object_value(schema, depth)
    if kind == "array":
        return _array_value(schema, depth)
    if kind == "string":
        return _string_value(schema)
    if kind in _SCALARS:
        return _SCALARS[kind]
    raise _Unbounded


def _object_value(schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    if schema.get("additionalProperties") not in (None, False) and not properties:
        raise _Unbounded
    return {name: _value(sub, depth + 1) for name, sub in properties.items()}


def _array_value(schema: Mapping[str, Any], depth: int) -> list[Any]:
    count = schema.get("maxItems")
    if not isinstance(count, int):
        raise _Unbounded
    return [_value(schema.get("items") or {}, depth + 1)] * count


def _string_value(schema: Mapping[str, Any]) -> str:
    if schema.get("format") in _FORMATS:
        return str(_FORMATS[schema["format"]])
    if isinstance(schema.get("maxLength"), int):
        return ("word " * schema["maxLength"])[: schema["maxLength"]]  # prose-like: ~1 token per word
    raise _Unbounded


class OutputTally:
    """Add up requests' output tokens two ways: the upper bound and the expectation, each with its basis.

    Upper bound: the request's ``max_tokens`` (else :data:`DEFAULT_OUTPUT_TOKENS`). Expectation:
    ``expected_output_tokens`` when given, else the tokens of the request's typical answer (capped
    at its bound), else the bound itself. ``count`` counts the tokens of a text for the model.
    """

    def __init__(self, count: Callable[[str], int], expected_output_tokens: int | None = None) -> None:
        self._count = count
        self._given = expected_output_tokens
        self._answer_tokens: dict[str, int] = {}  # one schema gives one typical answer: count it once
        self.bound = self.expected = 0
        self._bases: set[str] = set()
        self._expected_bases: set[str] = set()

    @property
    def bound_basis(self) -> str:
        """Where the upper bound came from."""
        return "; ".join(sorted(self._bases))

    @property
    def expected_basis(self) -> str:
        """Where the expectation came from."""
        return "; ".join(sorted(self._expected_bases))

    def add(self, max_output: int | None, produces_output: bool = True, answer: str | None = None) -> None:
        """Add one request: its output cap, whether it produces output at all, its typical answer."""
        if not produces_output:
            self._bases.add("none (embeddings)")
            self._expected_bases.add("none (embeddings)")
            return
        if max_output is not None:
            bound = max_output
            self._bases.add("max_tokens")
        else:
            bound = DEFAULT_OUTPUT_TOKENS
            self._bases.add(f"default {DEFAULT_OUTPUT_TOKENS}/request (set max_tokens or expected_output_tokens)")
        self.bound += bound
        if self._given is not None:
            self.expected += self._given
            self._expected_bases.add(f"expected_output_tokens={self._given}")
        elif answer is not None:
            tokens = self._answer_tokens.get(answer)
            if tokens is None:
                tokens = self._answer_tokens.setdefault(answer, self._count(answer))
            self.expected += min(tokens, bound)
            self._expected_bases.add(f"response schema, ~{min(tokens, bound)} tokens/answer")
        else:
            self.expected += bound
            self._expected_bases.add("= upper bound: no response schema (set expected_output_tokens)")
