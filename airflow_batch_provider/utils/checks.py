"""The one check for integer arguments: chunk sizes, byte caps, token counts, concurrency."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.exceptions import InvalidInputError


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None, *, suffix: str = "") -> int:
    """Return ``value`` when it is an integer (not a bool) from ``minimum`` to ``maximum`` (None: no maximum).

    Otherwise raise InvalidInputError naming the argument, the accepted range and the value
    given; ``suffix`` follows the range in the message (a unit, or "for openai").
    """
    too_big = maximum is not None and isinstance(value, int) and value > maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or too_big:
        accepted = f"from {minimum:,} to {maximum:,}" if maximum is not None else f"≥ {minimum:,}"
        raise InvalidInputError(f"{name} must be an integer {accepted}{suffix}, got {value!r}.")
    return value
