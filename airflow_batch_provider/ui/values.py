"""Typed readers for what the "LLM batches" view takes out of XComs: the one place that decides what a value may be.

An XCom is user data: anyone allowed to edit a DAG's XComs (the REST API's ``xcomEntries``) writes
any JSON there, and a task pushes whatever it likes. Python turns some of that into exceptions far
from where it was read: ``float(10**400)`` overflows, ``f"{10**5000:,}"`` exceeds the integer-to-text
limit, ``str()`` of the same integer raises too, iterating ``5`` is a TypeError. So the view never
uses an XCom value as it is: each reader below returns a value of its type within bounds, or says
the value is unreadable, and the pages show :data:`UNREADABLE` for it. Apart from decoding a
stored XCom at all (:func:`.queries._xcom_value`), nothing else in ``ui/`` catches a bad value's
exceptions. Counts out of range add nothing to a chunk's sums.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: What a page shows for a value of the wrong type or out of range.
UNREADABLE = "unreadable value"
#: No batch API takes more requests than this in one job; a bigger count is not a count.
MAX_COUNT = 10**12
#: Far above any batch job's cost; a bigger figure is not a cost.
MAX_USD = 1e12
TEXT_LIMIT = 300
_DIGITS = 13  # len(str(MAX_COUNT))


def count(value: Any) -> int | None:
    """Return ``value`` as a count in ``[0, MAX_COUNT]`` (a whole number or its ASCII digits), else None."""
    if isinstance(value, bool):
        return None  # JSON true is not a count
    if isinstance(value, str):
        digits = value.strip()
        value = int(digits) if 0 < len(digits) <= _DIGITS and digits.isascii() and digits.isdigit() else None
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) and 0 <= value <= MAX_COUNT else None
    if isinstance(value, int) and 0 <= value <= MAX_COUNT:
        return value
    return None


def count_or_zero(value: Any) -> int:
    """Return ``value`` as a count; 0 when it is missing or unreadable (for sums of lines)."""
    return count(value) or 0


def usd(value: Any) -> float | None:
    """Return ``value`` as an amount of dollars in ``[0, MAX_USD]``, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > MAX_USD:  # float() of a huge int overflows
        return None
    amount = float(value)
    return amount if math.isfinite(amount) and 0 <= amount <= MAX_USD else None


def text(value: Any, limit: int = TEXT_LIMIT) -> str:
    """Return ``value`` as at most ``limit`` characters: a text or a number as text; "" for none; else UNREADABLE."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value[:limit]
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and count(abs(value)) is not None:
        return str(value)[:limit]
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)[:limit]
    return UNREADABLE


def texts(value: Any, most: int, limit: int = 120) -> list[str]:
    """Return the first ``most`` entries of a list as texts (an empty list for anything but a list)."""
    return [text(entry, limit) for entry in items(value)[:most]]


def mapping(value: Any) -> Mapping[str, Any]:
    """Return ``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def items(value: Any) -> list[Any]:
    """Return the entries of a list (or tuple); an empty list for anything else (a text is no list)."""
    return list(value) if isinstance(value, list | tuple) else []


def show_count(value: Any) -> str:
    """Return a count as page text: ``1,234``; ``-`` when missing; :data:`UNREADABLE` when it is no count."""
    if value is None:
        return "-"
    found = count(value)
    return UNREADABLE if found is None else f"{found:,}"


def show_usd(value: Any) -> str:
    """Return dollars as page text: ``$1.2345``; ``-`` when missing; :data:`UNREADABLE` when it is no amount."""
    if value is None:
        return "-"
    amount = usd(value)
    return UNREADABLE if amount is None else f"${amount:,.4f}"
