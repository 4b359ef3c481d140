"""The tables of the "LLM batches" view: chunks over all their batches, failure kinds, the runs list's columns.

Every value is escaped for both text and attributes (``html.escape(..., quote=True)``), there is
no inline script, no event handler and no inline style (the bars are SVG with width attributes),
and no link: the page works under a Content-Security-Policy without scripts. Tables use a fixed
layout that wraps long ids, so the page fits a 1280 px window.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from html import escape
from typing import Any

from airflow_batch_provider.links import console_link
from airflow_batch_provider.ui.errors import ErrorKind
from airflow_batch_provider.ui.model import ChunkRow, RunView
from airflow_batch_provider.ui.values import show_usd, usd

# Bar colours as SVG presentation attributes (not CSS): they need no style-src.
_OK, _KO, _RETRY, _CARRIED = "#2e7d32", "#c62828", "#f9a825", "#78909c"
RUN_COLUMNS = "<th>backend</th><th>progress</th><th>failed</th><th>cost</th>"
_CHUNK_HEAD = (
    '<table id="chunks" class="fit"><thead><tr><th>chunk</th><th>progress (done / rows)</th><th>succeeded</th>'
    "<th>failed for good</th><th>being retried</th><th>batches (first, then follow-ups)</th>"
    "<th>status</th><th>elapsed</th></tr></thead><tbody>"
)
# Rules for these tables, appended to the page's style sheet (no style attribute anywhere). Fixed
# layout with set column widths; cells wrap between words. Only ids (in <code>) may break anywhere:
# a batch id has no spaces and would push the page wider; words and headers never break inside.
STYLE = (
    "table.fit{table-layout:fixed;width:100%} table.fit td{white-space:normal;overflow-wrap:break-word}"
    "table.fit td code{overflow-wrap:anywhere} table.fit th{white-space:normal;overflow-wrap:normal;hyphens:manual}"
    "svg.meter{display:block;width:100%;height:12px} td.batches code{display:block;font-size:11px}"
    "tr.chunk-errors td{border-bottom:1px solid #e4e7eb;padding-top:0} ul.errors{margin:0;padding-left:18px}"
    "ul.errors li,#error-kinds td{font-size:12px} .hint{color:#8a4b00} .ids code{background:#f5f7fa}"
    "h2{font-size:16px;margin:18px 0 6px} p.note{font-size:12px;margin:4px 0}"
    "div.stopped{color:#8a1c1c;font-size:12px;max-width:60em;overflow-wrap:break-word}"
    + "".join(
        f"#{table} th:nth-child({i}){{width:{width}%}}"
        for table, widths in (("chunks", (13, 15, 10, 8, 8, 28, 10, 8)), ("error-kinds", (7, 33, 8, 20, 32)))
        for i, width in enumerate(widths, 1)
    )
)


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _n(value: int) -> str:
    return _e(f"{value:,}")


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def bar(ok: float, ko: float, retry: float, title: str, carried: float = 0.0) -> str:
    """Return a stacked bar (carried from an earlier run, succeeded, failed, being retried; percentages) as SVG."""
    parts, x = [], 0.0
    segments = (("carried", carried, _CARRIED), ("ok", ok, _OK), ("ko", ko, _KO), ("retry", retry, _RETRY))
    for name, width, colour in segments:
        width = max(0.0, min(100.0 - x, width))
        parts.append(f'<rect class="{name}" x="{x:.2f}" y="0" width="{width:.2f}" height="10" fill="{colour}"/>')
        x += width
    return (
        '<svg class="meter" viewBox="0 0 100 10" preserveAspectRatio="none" width="100%" height="12" role="img">'
        f'<title>{_e(title)}</title><rect x="0" y="0" width="100" height="10" fill="#e4e7eb"/>{"".join(parts)}</svg>'
    )


def _batches(row: ChunkRow) -> str:
    href = console_link(row.console_url)  # a backend's console URL for a well-shaped id; never javascript: & co
    if href:
        first = f'<a class="console" target="_blank" rel="noopener noreferrer" href="{_e(href)}">'
        first += f"{_e(row.batch_id)}</a>"
    else:
        first = f"<code class='batch'>{_e(row.batch_id or '-')}</code>"
    follow = "".join(f"<code class='followup'>+\u00a0{_e(b)}</code>" for b in row.followups)
    return f"<td class='batches' data-batches='{len(row.attempts)}'>{first}{follow}</td>"


def _chunk_row(row: ChunkRow, now: float, selected: tuple[str, int] | None) -> str:
    ok, ko, retry, carried = row.percent()
    title = (
        f"{row.succeeded:,} succeeded, {row.failed:,} failed for good, {row.retrying:,} in follow-up batches, "
        f"{row.judging:,} failed in a batch being checked, {row.waiting:,} waiting, of {row.total:,}"
        + (f"; {row.carried:,} carried from an earlier run" if row.carried else "")
    )
    chosen = " selected" if selected is not None and selected in (row.submit_task, row.sensor_task) else ""
    attrs = {
        "data-chunk": row.key[1], "data-done": row.done, "data-total": row.total, "data-completed": row.succeeded,
        "data-failed": row.failed, "data-retrying": row.retrying + row.judging, "data-waiting": row.waiting,
        "data-carried": row.carried,
    }  # fmt: skip
    data = " ".join(f'{name}="{_e(value)}"' for name, value in attrs.items())
    status = _e(row.provider_status or "-")
    return (
        f'<tr class="chunk{chosen}" {data}><td>{_e(row.label)}</td>'
        f"<td>{bar(ok, ko, retry, title, carried)}<span class='muted counts'>{_n(row.done)} / {_n(row.total)}"
        f"{_carried(row.carried)}</span></td>"
        f"<td class='n'>{_n(row.succeeded)}</td><td class='n failed'>{_n(row.failed)}</td>"
        f"<td class='n retrying'>{_n(row.retrying + row.judging)}</td>{_batches(row)}"
        f"<td><span class='status'>{status}</span><br><span class='muted phase'>{_e(row.phase)}</span></td>"
        f"<td class='n'>{_e(_elapsed(row.elapsed_s(now)))}</td></tr>{_chunk_errors(row)}"
    )


def _carried(rows: int) -> str:
    """The counts' note of rows carried from an earlier run (skip_unchanged), or nothing."""
    return f" <span class='carried'>({_n(rows)} carried)</span>" if rows else ""


def _kind_item(kind: ErrorKind) -> str:
    ids = ", ".join(f"<code>{_e(i)}</code>" for i in kind.examples)
    final = "failed for good" if kind.final else "sent again"
    return (
        f'<li data-count="{_e(kind.count)}" data-final="{1 if kind.final else 0}"><b>{_n(kind.count)}</b> '
        f"<span class='kind'>{_e(kind.kind)}</span> <span class='muted'>({_e(final)})</span>"
        f"{f' <span class=ids>rows: {ids}</span>' if ids else ''}<br><span class='hint'>{_e(kind.hint)}</span></li>"
    )


def _chunk_errors(row: ChunkRow) -> str:
    if not row.errors:
        return ""
    items = "".join(_kind_item(kind) for kind in row.errors)
    head = f'<tr class="chunk-errors" data-chunk="{_e(row.key[1])}"><td colspan="8">'
    return f'{head}<ul class="errors">{items}</ul></td></tr>'


def chunk_table(view: RunView, now: float | None = None, selected: tuple[str, int] | None = None) -> str:
    """Return the chunk table: one row per chunk, and under it what failed with a next step."""
    now = time.time() if now is None else now
    note = ""
    if any(row.merged for row in view.chunks):
        note = (
            "<p class='muted note'>Chunk counts are the merge's, as in the totals above (answers it rejected, cut "
            "off or not valid JSON, count as failed); the lists under each chunk are what its batches reported.</p>"
        )
    elif view.summary:
        note = (
            "<p class='muted note'>Chunk counts are what the provider reported for each batch; the merge's totals "
            "above also count the answers it rejected (cut off, not valid JSON).</p>"
        )
    return _CHUNK_HEAD + "".join(_chunk_row(row, now, selected) for row in view.chunks) + "</tbody></table>" + note


def errors_panel(view: RunView) -> str:
    """Return the run's top failure kinds, with example row ids and the next step for each."""
    kinds = view.errors
    if not kinds:
        return ""
    source = "from the merge (final)" if view.summary else "so far, from the batches that ended (before the merge)"
    rows = "".join(
        f'<tr data-final="{1 if k.final else 0}"><td class="n">{_n(k.count)}</td><td class="kind">{_e(k.kind)}</td>'
        f"<td>{_e('for good' if k.final else 'sent again')}</td>"
        f"<td class='ids'>{', '.join(f'<code>{_e(i)}</code>' for i in k.examples) or '-'}</td>"
        f"<td class='hint'>{_e(k.hint)}</td></tr>"
        for k in kinds
    )
    return (
        f"<h2>What failed, and what to do</h2><p class='muted'>Top failure kinds {_e(source)}.</p>"
        '<table id="error-kinds" class="fit"><thead><tr><th>lines</th><th>failure</th><th>status</th>'
        "<th>example row ids</th><th>next step</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


_NO_COUNTS = "<td class='n failed'>-</td><td class='n cost'>-</td>"


def run_cells(run: Mapping[str, Any]) -> str:
    """Return the runs list's progress, failed and cost cells of one run (``run["view"]``: its RunView)."""
    view = run.get("view")
    if not isinstance(view, RunView):
        return "<td class='backend'>-</td><td class='progress'>-</td>" + _NO_COUNTS
    backend = "<br>".join(f"<code>{_e(name)}</code>" for name in view.backends) or "-"
    if not view.chunks:
        return f"<td class='backend'>{backend}</td><td class='progress'>{stopped_note(view) or '-'}</td>" + _NO_COUNTS
    total, done, carried = view.requests, view.done, view.carried
    ok, ko, retry, kept = view.percent()
    cost, actual = view.cost_usd
    cost_text = show_usd(cost) + ("" if actual or usd(cost) is None else " (estimate)")
    title = f"{done:,} of {total:,} done" + (f", {carried:,} carried from an earlier run" if carried else "")
    return (
        f"<td class='backend'>{backend}</td>"
        f"<td class='progress' data-done='{_e(done)}' data-total='{_e(total)}' data-carried='{_e(carried)}'>"
        f"{bar(ok, ko, retry, title, kept)}<span class='muted'>{_n(done)} / {_n(total)}{_carried(carried)}</span></td>"
        f"<td class='n failed'>{_n(view.failed)}</td><td class='n cost'>{_e(cost_text)}</td>"
    )


def stopped_note(view: RunView) -> str:
    """Say why a task stopped the run before anything was paid (the cost guard's own message), or nothing."""
    if not view.stopped:
        return ""
    head = "<b>Stopped before anything was sent:</b>"
    return f"<div class='stopped' data-testid='stopped'>{head} {_e(view.stopped)}</div>"
