"""Console URL templates: filled only with ids of a fixed shape, and recognised again from a finished URL.

A backend's ``console_template`` (``https://platform.openai.com/batches/{batch_id}``) is the only
source of a console link. Its ids come from provider answers and XComs, both untrusted, so each
placeholder takes only its shape (:data:`ID_SHAPES`), which holds nothing a URL must escape and
nothing that could leave the path for another host, query or fragment.
"""

from __future__ import annotations

import re
from string import Formatter
from typing import Any

#: What each placeholder of a console template may hold. Batch ids of every provider (OpenAI
#: ``batch_…``, Anthropic ``msgbatch_…``, Gemini's after ``batches/``, Bedrock's job id) are letters,
#: digits, ``_`` and ``-``: nothing a URL must escape, nothing that leaves the path (``/ ? # @ :``).
ID_SHAPES = {
    "batch_id": r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}",
    "region": r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}",  # an AWS region: us-east-1, us-gov-west-1
}


def _fields(template: str) -> list[tuple[str, str | None]]:
    return [(literal, field) for literal, field, _, _ in Formatter().parse(template)]


def fill_console_template(template: str, **ids: Any) -> str | None:
    """Return ``template`` filled with ``ids`` when it takes exactly them and each has its shape, else None."""
    wanted = {field for _, field in _fields(template) if field}
    if wanted != set(ids) or not all(
        isinstance(value, str) and re.fullmatch(ID_SHAPES.get(name, "(?!)"), value) for name, value in ids.items()
    ):
        return None
    return template.format(**ids)


def _pattern(template: str) -> re.Pattern[str]:
    """Return the regular expression of every URL ``template`` gives for well-shaped ids."""
    parts, seen = [], set()
    for literal, field in _fields(template):
        parts.append(re.escape(literal))
        if field:
            parts.append(f"(?P={field})" if field in seen else f"(?P<{field}>{ID_SHAPES.get(field, '(?!)')})")
            seen.add(field)
    return re.compile("".join(parts))


def template_matches(template: str, url: str) -> bool:
    """Return whether ``url`` is exactly what ``template`` gives for some well-shaped ids."""
    return _pattern(template).fullmatch(url) is not None
