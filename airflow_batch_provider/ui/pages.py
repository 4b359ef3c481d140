"""HTML of the "LLM batches" view: rendered on the server, refreshed in place while the run is live.

Plain HTML and a few lines of script, no bundle to build: the page is shown in an iframe of the
Airflow UI (a nav entry and a tab on DAG run / task instance pages) and works opened alone too.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import time
from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import quote, urlsplit

from airflow_batch_provider.ui.model import ChunkRow, RunView

REFRESH_MS = 3000

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px;color:#1f2933}
h1{font-size:20px;margin:0 0 6px} a{color:#1565c0} .muted{color:#616e7c}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.card{border:1px solid #e4e7eb;border-radius:6px;padding:6px 12px}
.card b{display:block;font-size:18px} table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f2;vertical-align:middle}
th{background:#f5f7fa;position:sticky;top:0} td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:flex;width:180px;height:12px;background:#e4e7eb;border-radius:3px;overflow:hidden}
.bar .ok{background:#2e7d32} .bar .ko{background:#c62828} tr.selected{background:#fff8e1}
code{font-size:12px} td:first-child{white-space:nowrap}
"""

# Links that open a new tab cannot do it from the sandboxed iframe (no allow-popups): ask the
# same-origin parent window to open them. Refresh: swap #content for a fresh render while live.
_SCRIPT = """
document.addEventListener('click', function (e) {
  var a = e.target.closest('a[target=_blank]');
  if (a && window.top !== window) { e.preventDefault(); window.top.open(a.href, '_blank', 'noopener'); }
});
function refresh() {
  var content = document.getElementById('content');
  if (!content || content.dataset.live !== '1') return;
  var url = new URL(window.location.href); url.searchParams.set('fragment', '1');
  fetch(url, {credentials: 'same-origin'}).then(function (r) { return r.ok ? r.text() : null; })
    .then(function (html) { if (html) { content.outerHTML = html; } })
    .finally(function () { setTimeout(refresh, REFRESH_MS); });
}
setTimeout(refresh, REFRESH_MS);
""".replace("REFRESH_MS", str(REFRESH_MS))
#: The page's Content-Security-Policy lets this one script run (by its hash) and no other.
SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(_SCRIPT.encode("utf-8")).digest()).decode("ascii")
_LOOPBACK_NAMES = {"localhost"}


def safe_link(url: Any) -> str | None:
    """Return ``url`` if a page may link to it: ``https:``, or ``http:`` to loopback (the emulator); else None.

    ``javascript:``, ``data:`` and every other scheme, a URL with credentials in it, and plain
    ``http:`` to another host are dropped: the value comes from an XCom anyone allowed to edit
    XComs could have set.
    """
    text = str(url or "").strip()
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
    except ValueError:
        return None
    if not host or parts.username or parts.password or any(ord(c) < 0x21 for c in text):
        return None
    if parts.scheme == "https":
        return text
    if parts.scheme == "http" and (host in _LOOPBACK_NAMES or _is_loopback_ip(host)):
        return text
    return None


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _n(value: Any) -> str:
    try:
        return f"{int(value or 0):,}"
    except (TypeError, ValueError, OverflowError):  # an XCom is user data: show a dash, not a 500
        return "-"


def _usd(value: Any) -> str:
    try:
        return "-" if value is None else f"${float(value):,.4f}"
    except (TypeError, ValueError, OverflowError):
        return "-"


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def page(title: str, body: str) -> str:
    """Return a whole HTML document around ``body``."""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}<script>{_SCRIPT}</script></body></html>"
    )


def _card(label: str, value: str, test_id: str) -> str:
    return f'<div class="card" data-testid="{escape(test_id)}"><b>{escape(value)}</b>{escape(label)}</div>'


def _totals(view: RunView) -> str:
    cards = [
        _card("requests", _n(view.requests), "total-rows"),
        _card("chunks", _n(len(view.chunks)), "total-chunks"),
        _card("completed (last poll)", _n(view.completed), "total-completed"),
        _card("failed (last poll)", _n(view.failed), "total-failed"),
        _card("expected cost (estimate)", _usd(view.estimated_cost_usd), "estimated-cost"),
    ]
    s: Mapping[str, Any] = view.summary or {}
    if s:
        statuses = s.get("statuses")
        cards += [
            _card(f"rows {name}", _n(count), f"status-{name}")
            for name, count in (statuses.items() if isinstance(statuses, Mapping) else ())
        ]
        cards += [
            _card("tokens in / out", f"{_n(s.get('input_tokens'))} / {_n(s.get('output_tokens'))}", "tokens"),
            _card("actual cost (batch)", _usd(s.get("actual_cost_usd")), "actual-cost"),
            _card("same work in real time", _usd(s.get("realtime_cost_usd")), "realtime-cost"),
        ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _chunk_row(row: ChunkRow, now: float, selected: tuple[str, int] | None) -> str:
    ok, ko = row.percent()
    href = safe_link(row.console_url)
    link = (
        f'<a class="console" target="_blank" rel="noopener noreferrer" href="{escape(href)}">{escape(row.batch_id)}</a>'
        if href
        else f"<code class='batch'>{escape(row.batch_id) or '-'}</code>"
    )
    followups = f" (+ {escape(', '.join(row.followups))})" if row.followups else ""
    chosen = selected is not None and selected in (row.submit_task, row.sensor_task)
    return (
        f'<tr class="chunk{" selected" if chosen else ""}" data-chunk="{row.key[1]}" data-completed="{row.completed}"'
        f' data-failed="{row.failed}" data-total="{row.total}"><td>{escape(row.label)}</td>'
        f'<td><div class="bar" title="{row.completed:,} completed, {row.failed:,} failed of {row.total:,}">'
        f'<span class="ok" style="width:{ok:.2f}%"></span><span class="ko" style="width:{ko:.2f}%"></span></div>'
        f'<span class="muted counts">{row.completed:,} / {row.failed:,} / {row.total:,}</span></td>'
        f"<td class='status'>{escape(row.provider_status or '-')}</td><td>{link}</td>"
        f"<td class='n attempts'>{len(row.attempts)}{followups}</td><td class='n'>{_elapsed(row.elapsed_s(now))}</td>"
        f"<td class='muted'>{escape(row.phase)}</td></tr>"
    )


def run_content(view: RunView, prefix: str, selected: tuple[str, int] | None = None) -> str:
    """Return the part of the run page that refreshes (totals and the chunk table)."""
    now = time.time()
    report = ""
    if view.summary and view.summary.get("report"):
        href = f"{prefix}/runs/{quote(view.dag_id, safe='')}/{quote(view.run_id, safe='')}/report"
        report = f' · <a id="report-link" target="_blank" rel="noopener" href="{escape(href)}">run report</a>'
    live = "refreshing every few seconds" if view.live else "finished"
    rows = "".join(_chunk_row(row, now, selected) for row in view.chunks)
    empty = "" if view.chunks else "<p>No chunk of this run has been written yet (or the DAG uses no batch tasks).</p>"
    return (
        f'<div id="content" data-live="{1 if view.live else 0}">'
        f'<p class="muted">run <b data-testid="run-state">{escape(view.run_state)}</b> · {live}{report}</p>'
        f"{_totals(view)}{empty}"
        '<table id="chunks"><thead><tr><th>chunk</th><th>progress (completed / failed / total)</th>'
        "<th>provider status</th><th>batch</th><th>batches</th><th>elapsed</th><th>task</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


def run_page(view: RunView, prefix: str, selected: tuple[str, int] | None = None) -> str:
    """Return the whole page of one DAG run."""
    title = f"LLM batches · {view.dag_id} / {view.run_id}"
    head = f'<h1>LLM batches: {escape(view.dag_id)}</h1><p class="muted">run <code>{escape(view.run_id)}</code></p>'
    return page(title, head + run_content(view, prefix, selected))


def runs_page(runs: list[dict[str, Any]], prefix: str) -> str:
    """Return the navigation page: the latest runs of DAGs that use these operators."""
    rows = "".join(
        f"<tr><td>{escape(r['dag_id'])}</td><td><a class='run' href='{escape(prefix)}/runs/"
        f"{quote(r['dag_id'], safe='')}/{quote(r['run_id'], safe='')}'>{escape(r['run_id'])}</a></td>"
        f"<td>{escape(str(r['state']))}</td><td>{escape(str(r['start_date'] or '-')[:19])}</td></tr>"
        for r in runs
    )
    body = (
        "<h1>LLM batches</h1><p class='muted'>Latest runs of DAGs with batch tasks you may read.</p>"
        "<table id='runs'><thead><tr><th>DAG</th><th>run</th><th>state</th><th>started</th></tr></thead>"
        f"<tbody>{rows or '<tr><td colspan=4>No run yet.</td></tr>'}</tbody></table>"
    )
    return page("LLM batches", body)
