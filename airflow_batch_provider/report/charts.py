"""The run report's charts, drawn by matplotlib and returned as inline SVG.

matplotlib's object API (``Figure`` without pyplot) touches no global backend state, so drawing
inside a worker cannot change how a user's own task plots. Text stays text in the SVG
(``svg.fonttype = none``): the file stays small and the labels stay searchable. The SVG carries
no date, so the same run draws the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

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


def _svg(figure: Any) -> str:
    from matplotlib import rc_context

    buffer = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "llm-batch-report"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prologue and doctype: the SVG is inlined in HTML


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    figure.set_facecolor("white")
    return figure


def status_chart(statuses: Mapping[str, int]) -> str:
    """Return a horizontal bar per final row status, with its count."""
    names = sorted(statuses, key=lambda s: (s != "succeeded", -statuses[s]))
    figure = _figure(7.5, 0.45 * max(2, len(names)) + 0.6)
    axes = figure.add_subplot()
    counts = [statuses[n] for n in names]
    bars = axes.barh(names, counts, color=[STATUS_COLOURS.get(n, "#455a64") for n in names])
    axes.bar_label(bars, labels=[f"{c:,}" for c in counts], padding=3)
    axes.invert_yaxis()
    axes.set_xlabel("rows")
    axes.set_xlim(0, max(counts or [1]) * 1.15)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def latency_timeline(chunks: Sequence[ChunkReport], zero: float) -> str:
    """Return one row per chunk: a bar per batch from its creation to its end at the provider.

    The first batch of a chunk is blue, follow-ups (line retries, resubmissions) orange. Times are
    seconds since the job's first batch was created.
    """
    height = min(12.0, 0.28 * max(4, len(chunks)) + 1.0)
    figure = _figure(9, height)
    axes = figure.add_subplot()
    # Thick horizontal lines, one collection per colour, not one rectangle per batch: a thousand
    # chunks draw in a fraction of a second. Their width (points) fills ~70% of a row.
    thickness = max(0.5, 0.7 * (height - 1.0) * 72 / max(4, len(chunks)))
    bars: dict[str, tuple[list[int], list[float], list[float]]] = {FIRST_ATTEMPT: ([], [], []), FOLLOW_UP: ([], [], [])}
    for row, chunk in enumerate(chunks):
        for number, attempt in enumerate(chunk.attempts):
            if attempt.created_at is None:
                continue
            end = attempt.ended_at if attempt.ended_at is not None else attempt.created_at
            rows, starts, ends = bars[FIRST_ATTEMPT if number == 0 else FOLLOW_UP]
            rows.append(row)
            starts.append(attempt.created_at - zero)
            ends.append(max(end, attempt.created_at + 0.05) - zero)
    for colour, (rows, starts, ends) in bars.items():
        if rows:
            axes.hlines(rows, starts, ends, colors=colour, linewidth=thickness)
    axes.set_ylim(len(chunks) - 0.5, -0.5)  # first chunk on top
    if len(chunks) <= LABELLED_CHUNKS:
        axes.set_yticks(range(len(chunks)), [c.label for c in chunks], fontsize=8)
    else:
        axes.set_ylabel(f"chunk (0 … {len(chunks) - 1})")
    axes.set_xlabel("seconds since the first batch was created (provider clock)")
    from matplotlib.patches import Patch

    axes.legend(
        handles=[Patch(color=FIRST_ATTEMPT, label="first batch"), Patch(color=FOLLOW_UP, label="follow-up batch")],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def cost_chart(estimated: float | None, actual: float | None, realtime: float | None) -> str:
    """Return three bars: the estimate before submission, the actual batch cost, the real-time price."""
    labels, values, colours = [], [], []
    for label, value, colour in (
        ("expected (estimate before submit)", estimated, "#90a4ae"),
        ("actual (batch)", actual, "#1565c0"),
        ("same work in real time", realtime, "#c62828"),
    ):
        if value is not None:
            labels.append(label)
            values.append(float(value))
            colours.append(colour)
    figure = _figure(7.5, 0.45 * max(2, len(labels)) + 0.6)
    axes = figure.add_subplot()
    bars = axes.barh(labels, values, color=colours)
    axes.bar_label(bars, labels=[f"${v:,.4f}" for v in values], padding=3)
    axes.invert_yaxis()
    axes.set_xlabel("USD")
    axes.set_xlim(0, max(values or [1.0]) * 1.3 or 1.0)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)
