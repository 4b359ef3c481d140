"""Render the run report as one self-contained HTML page and write it next to the merged output."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from airflow_batch_provider.report.charts import STATUS_COLOURS, cost_chart, latency_timeline, status_chart
from airflow_batch_provider.report.location import REPORT_FILE, published_report
from airflow_batch_provider.report.model import RunReport, build_report
from airflow_batch_provider.results.summary import carried_note
from airflow_batch_provider.utils.storage import atomic_write, join, makedirs

if TYPE_CHECKING:
    from airflow_batch_provider.results.merge import MergeStats

CHUNK_TABLE_LIMIT = 1_000  # the per-chunk table lists at most this many chunks (the worst first beyond it)

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1100px;color:#1f2933}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e4e7eb}
.muted{color:#616e7c} table{border-collapse:collapse;min-width:60%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f2;vertical-align:top}
th{background:#f5f7fa} td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;flex-wrap:wrap;gap:12px} .card{border:1px solid #e4e7eb;border-radius:6px;padding:8px 14px}
.card b{display:block;font-size:20px} code{font-size:12px} svg{max-width:100%;height:auto}
"""


def _n(value: Any) -> str:
    return f"{int(value or 0):,}"


def _usd(value: Any) -> str:
    return "unknown (model not priced)" if value is None else f"${float(value):,.4f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} s" if value < 120 else f"{value / 60:,.1f} min"


def _card(label: str, value: str, test_id: str) -> str:
    return f'<div class="card" data-testid="{escape(test_id)}"><b>{escape(value)}</b>{escape(label)}</div>'


def _header(report: RunReport) -> str:
    s = report.summary
    cards = [
        _card("rows", _n(s.get("rows")), "rows"),
        _card("succeeded", _n(s.get("succeeded")), "succeeded"),
        _card("failed", _n(s.get("failed")), "failed"),
        _card("carried from an earlier run", _n(s.get("carried_rows")), "carried"),
        _card("chunks", _n(s.get("chunks")), "chunks"),
        _card("actual cost", _usd(s.get("actual_cost_usd")), "actual-cost"),
    ]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        f"<h1>LLM batch run report: {escape(report.title)}</h1>"
        f'<p class="muted">Output <code>{escape(str(s.get("output", "")))}</code> · written {when}</p>'
        f'<div class="cards">{"".join(cards)}</div>{_carried_note(s)}'
    )


def _carried_note(s: Mapping[str, Any]) -> str:
    """Say which rows an earlier run answered (skip_unchanged): this run did not send or pay for them."""
    if not s.get("carried_rows"):
        return ""
    return (
        f"<p id='carried'>Rows carried: {escape(carried_note(s))}. This run's batches, tokens billed and cost "
        "count only the rows it sent. The earlier run's own report stays in the LLM batches view; the "
        "output folder's <code>_REPORT.html</code> is now this run's.</p>"
    )


def _status_section(report: RunReport) -> str:
    statuses = dict(report.summary.get("statuses") or {})
    rows = "".join(
        f'<tr data-status="{escape(name)}"><td><span style="color:{STATUS_COLOURS.get(name, "#455a64")}">■</span> '
        f'{escape(name)}</td><td class="n">{_n(count)}</td></tr>'
        for name, count in sorted(statuses.items(), key=lambda kv: -kv[1])
    )
    chart = status_chart(statuses) if statuses else ""
    return f'<h2>Row status</h2>{chart}<table id="statuses"><tr><th>status</th><th>rows</th></tr>{rows}</table>'


def _timeline_section(report: RunReport) -> str:
    zero = report.started_at
    latencies = [c.latency_s for c in report.chunks if c.latency_s is not None]
    if zero is None or not latencies:
        return "<h2>Provider latency per chunk</h2><p>The provider reported no batch timestamps for this run.</p>"
    ordered = sorted(latencies)
    median = ordered[len(ordered) // 2]
    return (
        "<h2>Provider latency per chunk</h2>"
        f"<p>Created → completed at the provider, per batch. Median chunk {_seconds(median)}, "
        f"slowest {_seconds(ordered[-1])}; {report.followup_batches:,} follow-up batch(es).</p>"
        f"{latency_timeline(report.chunks, zero)}"
    )


def _cost_section(report: RunReport) -> str:
    s = report.summary
    table = (
        '<table id="cost">'
        f"<tr><td>input tokens, all rows</td><td class='n'>{_n(s.get('input_tokens'))}</td></tr>"
        f"<tr><td>output tokens, all rows</td><td class='n'>{_n(s.get('output_tokens'))}</td></tr>"
        f"<tr><td>input tokens billed to this run</td><td class='n'>{_n(_sent(s, 'input'))}</td></tr>"
        f"<tr><td>output tokens billed to this run</td><td class='n'>{_n(_sent(s, 'output'))}</td></tr>"
        f"<tr><td>expected cost (estimate)</td><td class='n'>{_usd(s.get('cost_expected_usd'))}</td></tr>"
        f"<tr><td>upper bound (estimate)</td><td class='n'>{_usd(s.get('cost_upper_bound_usd'))}</td></tr>"
        f"<tr><td>actual cost (batch)</td><td class='n'>{_usd(s.get('actual_cost_usd'))}</td></tr>"
        f"<tr><td>same work in real time</td><td class='n'>{_usd(s.get('realtime_cost_usd'))}</td></tr>"
        "</table>"
    )
    note = f"<p>{escape(str(s['cost_comparison']))}</p>" if s.get("cost_comparison") else ""
    chart = ""
    if "actual_cost_usd" in s:
        chart = cost_chart(s.get("cost_expected_usd"), s.get("actual_cost_usd"), s.get("realtime_cost_usd"))
    return f"<h2>Tokens and cost</h2>{chart}{table}{note}"


def _sent(s: Mapping[str, Any], side: str) -> Any:
    """This run's tokens on ``side`` (a summary from before the key existed: all of them)."""
    return s.get(f"new_{side}_tokens", s.get(f"{side}_tokens"))


def _errors_section(report: RunReport) -> str:
    s = report.summary
    examples: Mapping[str, Sequence[str]] = s.get("error_examples") or {}
    top = s.get("top_errors") or []
    if not top:
        return "<h2>Errors</h2><p>No row failed.</p>"
    rows = "".join(
        f"<tr><td><code>{escape(str(kind))}</code></td><td class='n'>{_n(count)}</td>"
        f"<td>{escape(', '.join(examples.get(kind, [])))}</td></tr>"
        for kind, count in top
    )
    return (
        "<h2>Top error kinds</h2><table id='errors'><tr><th>kind (status/code: message)</th><th>rows</th>"
        f"<th>example row ids (custom_id)</th></tr>{rows}</table>"
    )


def _retries_section(report: RunReport) -> str:
    s = report.summary
    retried, recovered = int(s.get("retried_rows") or 0), int(s.get("recovered_rows") or 0)
    truncated = int(s.get("truncated_rows") or 0)
    text = (
        f"<p id='retries'>{_n(retried)} row(s) were sent again in {report.followup_batches:,} follow-up batch(es); "
        f"{_n(recovered)} of them succeeded in the end ({_n(retried - recovered)} still failed).</p>"
    )
    cut = ", ".join(s.get("truncated_examples") or [])
    text += (
        f"<h2>Truncated answers</h2><p id='truncated'>{_n(truncated)} answer(s) stopped at the output-token cap "
        f"(finish_reason <code>length</code>){': e.g. ' + escape(cut) if cut else ''}. "
        "Raise <code>max_tokens</code> in request_params if they matter.</p>"
    )
    return "<h2>Retries</h2>" + text


def _chunk_table(report: RunReport) -> str:
    chunks = report.chunks
    note = ""
    if len(chunks) > CHUNK_TABLE_LIMIT:
        chunks = sorted(chunks, key=lambda c: (-c.failed, -(c.latency_s or 0)))[:CHUNK_TABLE_LIMIT]
        note = f"<p>The {CHUNK_TABLE_LIMIT:,} chunks with the most failed rows, then the slowest.</p>"
    rows = "".join(
        f"<tr data-chunk='{c.chunk_index}'><td>{escape(c.label)}</td><td class='n'>{_n(c.rows)}</td>"
        f"<td class='n'>{_n(c.statuses.get('succeeded', 0))}</td><td class='n'>{_n(c.failed)}</td>"
        f"<td class='n'>{len(c.attempts)}</td><td class='n'>{_seconds(c.latency_s)}</td>"
        f"<td><code>{escape(' → '.join(a.batch_id for a in c.attempts))}</code></td></tr>"
        for c in chunks
    )
    return (
        f"<h2>Chunks</h2>{note}<table id='chunks'><tr><th>chunk</th><th>rows</th><th>succeeded</th><th>failed</th>"
        f"<th>batches</th><th>provider latency</th><th>batch ids</th></tr>{rows}</table>"
    )


def render_report(report: RunReport) -> str:
    """Return the whole page."""
    body = "".join(
        part(report)
        for part in (_header, _status_section, _timeline_section, _cost_section, _errors_section, _retries_section)
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>LLM batch report · {escape(report.title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}{_chunk_table(report)}</body></html>"
    )


def write_run_report(
    output_dir: str,
    summary: Mapping[str, Any],
    chunks: Sequence[tuple[Mapping[str, Any], MergeStats]],
    title: str = "",
    run_key: tuple[str, str, str] | None = None,
) -> str:
    """Write ``output_dir/_REPORT.html`` (through a temporary name) and return its path.

    ``run_key`` (dag_id, run_id, merge task_id): also publish it under the report root, where the
    "LLM batches" view serves it from (:mod:`.location`).
    """
    report = build_report(title or str(summary.get("output", "")), summary, chunks)
    content = render_report(report).encode("utf-8")
    path = join(output_dir, REPORT_FILE)
    with atomic_write(path) as out:
        out.write(content)
    if run_key is not None:
        published = published_report(*run_key)
        makedirs(str(published.parent))
        with atomic_write(str(published)) as out:
            out.write(content)
    return path
