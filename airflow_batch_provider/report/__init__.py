"""The run report: ``_REPORT.html`` written by the merge next to the merged output.

One self-contained HTML file (inline CSS and SVG, no script, no network fetch), so it reads the
same when opened from the output folder, from S3, or as a mail attachment. Its figures are the
merge summary's (``_SUMMARY.json``) plus each chunk's merge counters and batch timestamps: the
report adds pictures, never a second way of counting.

- :mod:`.model`: the report's data, built from the summary and the per-chunk merge results.
- :mod:`.charts`: the three charts, as inline SVG.
- :mod:`.svg`: the SVG building blocks the charts share: escaping, round-number ticks, a bar chart.
- :mod:`.html`: the page, and :func:`write_run_report`, the merge step's single entry point.
"""

from __future__ import annotations

from airflow_batch_provider.report.html import REPORT_FILE, render_report, write_run_report

__all__ = ["REPORT_FILE", "render_report", "write_run_report"]
