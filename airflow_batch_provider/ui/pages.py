"""HTML of the "LLM batches" view: rendered on the server, refreshed in place while the run is live.

Plain HTML and a few lines of script, no bundle to build: the page is shown in an iframe of the
Airflow UI (a nav entry and a tab on DAG run / task instance pages) and works opened alone too.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import quote

from airflow_batch_provider.ui.model import RunView
from airflow_batch_provider.ui.tables import RUN_COLUMNS, chunk_table, errors_panel, run_cells, stopped_note
from airflow_batch_provider.ui.tables import STYLE as TABLE_STYLE
from airflow_batch_provider.ui.values import mapping, show_count, show_usd, text

REFRESH_MS = 3000

_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px;color:#1f2933}
h1{font-size:20px;margin:0 0 6px} a{color:#1565c0} .muted{color:#616e7c}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.card{border:1px solid #e4e7eb;border-radius:6px;padding:6px 12px}
.card b{display:block;font-size:18px} table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f2;vertical-align:middle}
th{background:#f5f7fa;position:sticky;top:0} td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.selected{background:#fff8e1}
code{font-size:12px} td:first-child{white-space:nowrap}
"""
_STYLE += TABLE_STYLE  # the chunk and failure tables (ui/tables.py)

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
        _card("rows", show_count(view.requests), "total-rows"),
        _card("chunks", show_count(len(view.chunks)), "total-chunks"),
        _card("done (final result)", show_count(view.done), "total-done"),
        _card("succeeded", show_count(view.completed), "total-completed"),
        _card("failed for good", show_count(view.failed), "total-failed"),
        _card("being retried or checked", show_count(view.retrying), "total-retrying"),
        _card("expected cost (estimate)", show_usd(view.estimated_cost_usd), "estimated-cost"),
    ]
    if view.carried:
        cards.insert(3, _card("carried from an earlier run (not sent)", show_count(view.carried), "total-carried"))
    s: Mapping[str, Any] = mapping(view.summary)
    if s:
        # "succeeded" has its card above: the statuses add only how the failures ended.
        statuses = {text(name): n for name, n in mapping(s.get("statuses")).items() if text(name) != "succeeded"}
        cards += [_card(f"failed as {name}", show_count(n), f"status-{name}") for name, n in statuses.items()]
        sent_in, sent_out = (s.get(f"new_{side}_tokens", s.get(f"{side}_tokens")) for side in ("input", "output"))
        cards += [
            _card("tokens in / out, this run's batches", f"{show_count(sent_in)} / {show_count(sent_out)}", "tokens"),
            _card("actual cost (batch)", show_usd(s.get("actual_cost_usd")), "actual-cost"),
            _card("same work in real time", show_usd(s.get("realtime_cost_usd")), "realtime-cost"),
        ]
    return f'<div class="cards">{"".join(cards)}</div>'


def run_content(view: RunView, prefix: str, selected: tuple[str, int] | None = None) -> str:
    """Return the part of the run page that refreshes (totals and the chunk table)."""
    now = time.time()
    report = ""
    if view.summary and view.summary.get("report"):
        href = f"{prefix}/runs/{quote(view.dag_id, safe='')}/{quote(view.run_id, safe='')}/report"
        report = f' · <a id="report-link" target="_blank" rel="noopener" href="{escape(href)}">run report</a>'
    live = "refreshing every few seconds" if view.live else "finished"
    empty = "" if view.chunks else "<p>No chunk of this run has been written yet (or the DAG uses no batch tasks).</p>"
    return (
        f'<div id="content" data-live="{1 if view.live else 0}">'
        f'<p class="muted">run <b data-testid="run-state">{escape(view.run_state)}</b> · {live}{report}</p>'
        f"{stopped_note(view)}{_totals(view)}{empty}{chunk_table(view, now, selected)}{errors_panel(view)}</div>"
    )


def run_page(view: RunView, prefix: str, selected: tuple[str, int] | None = None) -> str:
    """Return the whole page of one DAG run."""
    title = f"LLM batches · {view.dag_id} / {view.run_id}"
    backends = "".join(f" · <code class='backend'>{escape(name)}</code>" for name in view.backends)
    head = (
        f"<h1>LLM batches: {escape(view.dag_id)}</h1>"
        f'<p class="muted">run <code>{escape(view.run_id)}</code>{backends}</p>'
    )
    return page(title, head + run_content(view, prefix, selected))


def runs_page(runs: list[dict[str, Any]], prefix: str) -> str:
    """Return the navigation page: the latest runs of DAGs that use these operators."""
    rows = "".join(
        f"<tr><td>{escape(r['dag_id'])}</td><td><a class='run' href='{escape(prefix)}/runs/"
        f"{quote(r['dag_id'], safe='')}/{quote(r['run_id'], safe='')}'>{escape(r['run_id'])}</a></td>"
        f"<td>{escape(str(r['state']))}</td><td>{escape(str(r['start_date'] or '-')[:19])}</td>{run_cells(r)}</tr>"
        for r in runs
    )
    body = (
        "<h1>LLM batches</h1><p class='muted'>Latest runs of DAGs with batch tasks you may read.</p>"
        "<table id='runs'><thead><tr><th>DAG</th><th>run</th><th>state</th><th>started</th>"
        f"{RUN_COLUMNS}</tr></thead><tbody>{rows or '<tr><td colspan=8>No run yet.</td></tr>'}</tbody></table>"
    )
    return page("LLM batches", body)
