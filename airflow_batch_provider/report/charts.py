"""The run report's three charts, drawn as inline SVG by :mod:`.svg` (no plotting library).

Each function returns an ``<svg>`` element without an XML prologue, ready to inline in the page.
The same input gives the same bytes (no date, no random ids).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_batch_provider.report import svg
from airflow_batch_provider.report.model import ChunkReport

STATUS_COLOURS = {
    "succeeded": "#2e7d32",
    "invalid_output": "#f9a825",
    "errored": "#c62828",
    "expired": "#6d4c41",
    "canceled": "#757575",
    "missing": "#8e24aa",
}
FIRST_ATTEMPT = "#1565c0"
FOLLOW_UP = "#ef6c00"
LABELLED_CHUNKS = 40  # above this many chunks the timeline drops per-chunk labels (they would overlap)
MIN_BAR_PX = 2.0  # a batch that ended the second it was created still shows as a visible tick


def status_chart(statuses: Mapping[str, int]) -> str:
    """Return a horizontal bar per final row status, with its count."""
    names = sorted(statuses, key=lambda s: (s != "succeeded", -statuses[s]))
    counts = [statuses[n] for n in names]
    colours = [STATUS_COLOURS.get(n, "#455a64") for n in names]
    return svg.bar_chart(names, [float(c) for c in counts], colours, [f"{c:,}" for c in counts], "rows")


def cost_chart(estimated: float | None, actual: float | None, realtime: float | None) -> str:
    """Return three bars: the estimate before submission, the actual batch cost, the real-time price."""
    bars = [
        (label, float(value), colour)
        for label, value, colour in (
            ("expected (estimate before submit)", estimated, "#90a4ae"),
            ("actual (batch)", actual, "#1565c0"),
            ("same work in real time", realtime, "#c62828"),
        )
        if value is not None
    ]
    labels, values, colours = [b[0] for b in bars], [b[1] for b in bars], [b[2] for b in bars]
    return svg.bar_chart(labels, values, colours, [f"${v:,.4f}" for v in values], "USD")


def _batch_spans(chunks: Sequence[ChunkReport], zero: float) -> dict[str, list[tuple[int, float, float]]]:
    """Return, per colour, (row, start, end) in seconds since ``zero`` of every batch with a creation time."""
    spans: dict[str, list[tuple[int, float, float]]] = {FIRST_ATTEMPT: [], FOLLOW_UP: []}
    for row, chunk in enumerate(chunks):
        for number, attempt in enumerate(chunk.attempts):
            if attempt.created_at is None:
                continue
            end = attempt.ended_at if attempt.ended_at is not None else attempt.created_at
            colour = FIRST_ATTEMPT if number == 0 else FOLLOW_UP
            spans[colour].append((row, attempt.created_at - zero, max(end, attempt.created_at) - zero))
    return spans


def _bar_paths(
    spans: dict[str, list[tuple[int, float, float]]], left: float, top: float, row: float, scale: float
) -> list[str]:
    """Return one ``<path>`` per colour, each batch an "M x y h width" stroke filling ~70% of its row.

    One element per colour, not one per batch: a thousand chunks stay a few tens of kB and render at once.
    """
    paths = []
    for colour, colour_spans in spans.items():
        segments = "".join(
            f"M{svg.num(left + start * scale)} {svg.num(top + row * (index + 0.5))}"
            f"h{svg.num(max(MIN_BAR_PX, (end - start) * scale))}"
            for index, start, end in colour_spans
        )
        if segments:
            width = svg.num(max(0.5, 0.7 * row))
            paths.append(f'<path d="{segments}" stroke="{colour}" stroke-width="{width}" fill="none"/>')
    return paths


def _row_labels(chunks: Sequence[ChunkReport], right: float, top: float, row: float) -> list[str]:
    """Return each chunk's label left of its row, or above LABELLED_CHUNKS one rotated axis title."""
    if len(chunks) <= LABELLED_CHUNKS:
        return [svg.text(right, top + row * (i + 0.5), c.label, size=10, anchor="end") for i, c in enumerate(chunks)]
    middle = top + row * len(chunks) / 2
    title = f"chunk (0 … {len(chunks) - 1})"
    return [svg.text(14, middle, title, anchor="middle", extra=f' transform="rotate(-90 14 {svg.num(middle)})"')]


def _legend(x: float, top: float) -> list[str]:
    """Return the colour key, right of the plot where no bar can hide it."""
    parts = []
    for index, (colour, name) in enumerate(((FIRST_ATTEMPT, "first batch"), (FOLLOW_UP, "follow-up batch"))):
        y = top + 8 + 20 * index
        parts.append(f'<rect x="{svg.num(x)}" y="{svg.num(y - 6)}" width="12" height="12" fill="{colour}"/>')
        parts.append(svg.text(x + 18, y, name, size=11))
    return parts


def latency_timeline(chunks: Sequence[ChunkReport], zero: float) -> str:
    """Return one row per chunk: a bar per batch from its creation to its end at the provider.

    The first batch of a chunk is blue, follow-ups (line retries, resubmissions) orange, the first
    chunk on top. Times are seconds since the job's first batch was created.
    """
    top, plot_width, legend_width = 10.0, 620.0, 140.0
    # Rows of 24 px, squeezed below that from 46 chunks on so the chart stays under ~1,100 px tall.
    row = min(24.0, 1100.0 / max(1, len(chunks)))
    plot_height = row * max(2, len(chunks))
    left = 36.0  # room for the rotated axis title
    if len(chunks) <= LABELLED_CHUNKS:
        left = max([svg.text_width(c.label, 10) for c in chunks] + [20.0]) + 10
    spans = _batch_spans(chunks, zero)
    ticks = svg.nice_ticks(max((end for colour in spans.values() for _, _, end in colour), default=0.0))
    parts = _bar_paths(spans, left, top, row, plot_width / ticks[-1])
    parts += _row_labels(chunks, left - 5, top, row)
    title = "seconds since the first batch was created (provider clock)"
    parts += svg.x_axis(ticks, left, plot_width, top, top + plot_height, title)
    parts += _legend(left + plot_width + 16, top)
    return svg.document(left + plot_width + legend_width, top + plot_height + 48, parts, "provider latency per chunk")
