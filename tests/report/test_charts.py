"""The run report's charts: hand-written SVG, valid XML, escaped user text, small and fast at scale."""

from __future__ import annotations

import math
import time
import xml.etree.ElementTree as ET

import pytest

from airflow_batch_provider.report.charts import (
    FIRST_ATTEMPT,
    FOLLOW_UP,
    STATUS_COLOURS,
    cost_chart,
    latency_timeline,
    status_chart,
)
from airflow_batch_provider.report.model import AttemptTiming, ChunkReport
from airflow_batch_provider.report.svg import nice_ticks

NS = "{http://www.w3.org/2000/svg}"
HOSTILE = '<script>&"'


def _chunk(index: int, *spans: tuple[float, float | None], label: str | None = None) -> ChunkReport:
    attempts = tuple(
        AttemptTiming(f"batch_{index}_{n}", "completed", start, end, 1, 0, 1) for n, (start, end) in enumerate(spans)
    )
    return ChunkReport(label or f"chunk {index + 1}", index, 1, {"succeeded": 1}, 0, 0, 0, 0, 0, attempts)


def _parse(chart: str) -> ET.Element:
    assert chart.startswith("<svg") and "<?xml" not in chart
    root = ET.fromstring(chart)
    assert root.tag == f"{NS}svg" and root.get("viewBox", "").startswith("0 0 ") and root.get("width")
    assert not any(e.tag.endswith("script") or "href" in str(e.attrib) for e in root.iter())
    return root


def _texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(f"{NS}text")]


def test_status_chart_shows_each_status_with_its_count_and_colour():
    chart = status_chart({"errored": 12, "succeeded": 1234, HOSTILE: 3})
    root = _parse(chart)
    texts = _texts(root)
    assert {"succeeded", "errored", HOSTILE, "1,234", "12", "3", "rows"} <= set(texts)
    assert texts.index("succeeded") < texts.index("errored") < texts.index(HOSTILE)  # succeeded first, then by count
    fills = [r.get("fill") for r in root.iter(f"{NS}rect")]
    assert STATUS_COLOURS["succeeded"] in fills and STATUS_COLOURS["errored"] in fills
    assert "&lt;script&gt;&amp;" in chart and "<script" not in chart


def test_cost_chart_labels_each_known_figure_in_dollars():
    texts = _texts(_parse(cost_chart(0.015, 1234.5, None)))
    assert {"expected (estimate before submit)", "actual (batch)", "$0.0150", "$1,234.5000", "USD"} <= set(texts)
    assert "same work in real time" not in texts  # no real-time price: no bar


def test_timeline_escapes_labels_puts_the_first_chunk_on_top_and_has_both_legend_entries():
    chunks = [_chunk(0, (100.0, 160.0), (170.0, 170.0), label=HOSTILE), _chunk(1, (101.0, None), label="b\x01")]
    chart = latency_timeline(chunks, zero=100.0)
    root = _parse(chart)  # a control character in a label does not break the XML either
    assert "&lt;script&gt;&amp;" in chart and "<script" not in chart
    labels = {e.text: float(e.get("y", "0")) for e in root.iter(f"{NS}text")}
    assert labels[HOSTILE] < labels["b\ufffd"]
    assert {"first batch", "follow-up batch"} <= set(labels)
    paths = {p.get("stroke"): p.get("d", "") for p in root.iter(f"{NS}path") if p.get("stroke-width")}
    # The follow-up ended the second it was created and the second chunk has no end: both still show.
    assert float(paths[FOLLOW_UP].split("h")[1]) >= 2
    assert paths[FIRST_ATTEMPT].count("M") == 2


def test_a_thousand_chunk_timeline_is_one_path_per_colour_and_fast():
    chunks = [
        _chunk(i, (i * 0.5, i * 0.5 + 30 + i % 70), *([(600.0 + i, 640.0 + i)] if i % 9 == 0 else []))
        for i in range(1000)
    ]
    started = time.perf_counter()
    chart = latency_timeline(chunks, zero=0.0)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.25, elapsed
    root = _parse(chart)
    strokes = [p.get("stroke") for p in root.iter(f"{NS}path") if p.get("stroke-width")]
    assert sorted(strokes) == sorted([FIRST_ATTEMPT, FOLLOW_UP])
    assert len(list(root.iter())) < 40  # no element per batch or per chunk label
    assert "chunk (0 … 999)" in _texts(root) and "chunk 1" not in _texts(root)
    assert len(chart) < 60_000


@pytest.mark.parametrize("maximum", [1, 3, 7, 10, 0.0615, 0.123, 97, 1199, 3e-5, 123_456_789, 0.3])
def test_nice_ticks_are_round_numbers_covering_the_maximum(maximum):
    ticks = nice_ticks(maximum)
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), (ticks, mantissa)
    assert ticks[0] == 0 and all(math.isclose(t, i * step) for i, t in enumerate(ticks))
    assert ticks[-1] >= maximum > ticks[-2] and 3 <= len(ticks) <= 6
    assert all(t == round(t, 12) for t in ticks)


def test_nice_ticks_of_nothing_still_make_an_axis():
    assert nice_ticks(0) == nice_ticks(float("nan")) == [0.0, 1.0]


def test_the_same_input_draws_the_same_bytes():
    chunks = [_chunk(i, (float(i), i + 12.5)) for i in range(50)]
    assert latency_timeline(chunks, 0.0) == latency_timeline(list(chunks), 0.0)
    assert status_chart({"succeeded": 5, "errored": 1}) == status_chart({"succeeded": 5, "errored": 1})
    assert cost_chart(0.1, 0.05, 0.2) == cost_chart(0.1, 0.05, 0.2)
