"""What one Gemini request line asks the model to read, for the cost estimate's token counts.

A ``GenerateContentRequest`` holds the system instruction's parts, the turns' parts, and in
``generationConfig`` the output cap (``maxOutputTokens``) and the answer's schema
(``responseJsonSchema`` or the OpenAPI-style ``responseSchema``). Text parts are counted as they
are, the schema as its JSON text; Gemini publishes no per-turn framing cost, so none is added.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import orjson

from airflow_batch_provider.cost.answers import typical_answer


def _texts(content: Any, pieces: list[str]) -> None:
    """Append the text parts of a ``Content`` (``{"parts": [...]}``) to ``pieces``."""
    parts = content.get("parts") if isinstance(content, Mapping) else None
    for part in parts or ():
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            pieces.append(part["text"])


@functools.lru_cache(maxsize=64)
def _typical(schema_json: str) -> str | None:
    """Typical answer of one schema, worked out once per distinct schema (every line of a job has the same)."""
    schema = orjson.loads(schema_json)
    return typical_answer(schema) if isinstance(schema, Mapping) else None


def gemini_request_parts(request: Mapping[str, Any]) -> tuple[tuple[str, ...], int | None, str | None]:
    """Return (text pieces, output cap, typical answer) of one ``GenerateContentRequest``.

    :func:`airflow_batch_provider.cost.tokens.request_parts` turns them into its ``RequestParts``
    (this module imports nothing of it, so neither imports the other at load time).
    """
    pieces: list[str] = []
    _texts(request.get("systemInstruction"), pieces)
    for content in request.get("contents") or ():
        _texts(content, pieces)
    config = request.get("generationConfig")
    config = config if isinstance(config, Mapping) else {}
    max_output = config.get("maxOutputTokens")
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    answer = None
    if isinstance(schema, Mapping):
        schema_json = orjson.dumps(schema).decode()
        pieces.append(schema_json)
        answer = _typical(schema_json)
    cap = max_output if isinstance(max_output, int) and not isinstance(max_output, bool) else None
    return tuple(pieces), cap, answer
