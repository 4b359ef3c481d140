"""A few SVG building blocks for the run report's charts: escaping, round-number ticks, an axis, a bar chart.

Hand-written instead of a plotting library: three simple charts do not justify matplotlib's import
time and install size in every merge task. Everything is plain string formatting with fixed
rounding, so the same input gives the same bytes. All text is XML-escaped (labels come from user
data) and stays text, so it is searchable in the page; there is no script and no external reference.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from html import escape  # not xml.sax.saxutils: that imports urllib.request (~20 ms) for the same five entities

FONT = "system-ui,-apple-system,'Segoe UI',sans-serif"
AXIS = "#52606d"
TEXT = "#1f2933"
CHAR_WIDTH = 0.6  # average glyph width in ems of a sans-serif font: enough to size label columns
# Characters XML 1.0 forbids even when escaped: replaced, so a stray control byte in a label cannot
# make the chart unparsable.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def escape_text(text: str) -> str:
    """Return ``text`` safe as XML element content or inside a double-quoted attribute.

    ``html.escape`` writes only &amp; &lt; &gt; &quot; and &#x27;, all valid XML.
    """
    return escape(_NOT_XML.sub("\ufffd", text), quote=True)


def attr(value: str) -> str:
    """Return ``value`` as a double-quoted, escaped XML attribute value."""
    return f'"{escape_text(value)}"'


def num(value: float) -> str:
    """Return a coordinate with one decimal, without a trailing ``.0``: short paths, stable bytes."""
    text = f"{value:.1f}"
    text = text[:-2] if text.endswith(".0") else text
    return "0" if text == "-0" else text


def text_width(text: str, size: float) -> float:
    """Return an estimate of the width in pixels of ``text`` at font size ``size``."""
    return len(text) * size * CHAR_WIDTH


def nice_ticks(maximum: float, target: int = 5) -> list[float]:
    """Return ticks 0, step, 2·step … up to the first one at or above ``maximum``.

    The step is 1, 2, 2.5 or 5 times a power of ten, the smallest giving at most ``target`` steps,
    so the labels are round numbers and the last tick covers the largest value without leaving
    much of the axis empty.
    """
    if not math.isfinite(maximum) or maximum <= 0:
        return [0.0, 1.0]
    magnitude = 10.0 ** math.floor(math.log10(maximum / target))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if maximum / (m * magnitude) <= target)
    # round(): 0.1 * 3 is 0.30000000000000004; the ticks are meant to be exactly round numbers.
    steps = math.ceil(round(maximum / step, 9))
    return [round(i * step, 12) for i in range(steps + 1)]


def tick_label(value: float, step: float) -> str:
    """Return a tick's label with as many decimals as the step needs (0.25 → two, 50 → none)."""
    if value == 0:
        return "0"
    decimals = next((d for d in range(12) if abs(round(step, d) - step) <= step * 1e-9), 12)
    return f"{value:,.{decimals}f}"


def text(x: float, y: float, content: str, size: float = 12, anchor: str = "start", extra: str = "") -> str:
    """Return a ``<text>`` element; ``y`` is the middle of the line (dominant-baseline central)."""
    return (
        f'<text x="{num(x)}" y="{num(y)}" font-size="{num(size)}" text-anchor="{anchor}" '
        f'dominant-baseline="central"{extra}>{escape_text(content)}</text>'
    )


def document(width: float, height: float, parts: Sequence[str], label: str) -> str:
    """Return the ``<svg>`` element: a viewBox and a width so it scales down with the page."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(width)} {num(height)}" '
        f'width="{num(width)}" height="{num(height)}" role="img" aria-label={attr(label)} '
        f'font-family={attr(FONT)} fill="{TEXT}"><rect width="100%" height="100%" fill="#fff"/>'
        f"{''.join(parts)}</svg>"
    )


def x_axis(ticks: Sequence[float], left: float, width: float, top: float, bottom: float, title: str) -> list[str]:
    """Return the left and bottom axis lines, the ticks with their labels and the x axis title."""
    step = ticks[1] - ticks[0]
    parts = [f'<path d="M{num(left)} {num(top)}V{num(bottom)}H{num(left + width)}" stroke="{AXIS}" fill="none"/>']
    marks = []
    for tick in ticks:
        x = left + width * tick / ticks[-1]
        marks.append(f"M{num(x)} {num(bottom)}v5")
        parts.append(text(x, bottom + 15, tick_label(tick, step), size=11, anchor="middle"))
    parts.append(f'<path d="{"".join(marks)}" stroke="{AXIS}"/>')
    parts.append(text(left + width / 2, bottom + 35, title, anchor="middle"))
    return parts


def bar_chart(
    labels: Sequence[str], values: Sequence[float], colours: Sequence[str], value_labels: Sequence[str], axis_title: str
) -> str:
    """Return horizontal bars, the first on top, each labelled on the left and its value on its right."""
    row, bar, plot_width, top = 30.0, 20.0, 480.0, 10.0
    label_column = max([text_width(s, 12) for s in labels] + [20.0]) + 12
    value_column = max([text_width(s, 12) for s in value_labels] + [0.0]) + 10
    bottom = top + row * max(2, len(labels))
    ticks = nice_ticks(max(values, default=0.0))
    parts = []
    for index, (label, value, colour, value_label) in enumerate(zip(labels, values, colours, value_labels)):
        middle = top + row * (index + 0.5)
        length = plot_width * max(0.0, value) / ticks[-1]
        parts.append(
            f'<rect x="{num(label_column)}" y="{num(middle - bar / 2)}" width="{num(length)}" '
            f'height="{num(bar)}" fill={attr(colour)}/>'
        )
        parts.append(text(label_column - 6, middle, label, anchor="end"))
        parts.append(text(label_column + length + 4, middle, value_label))
    parts += x_axis(ticks, label_column, plot_width, top, bottom, axis_title)
    return document(label_column + plot_width + value_column, bottom + 48, parts, axis_title)
