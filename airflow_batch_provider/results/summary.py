"""Counters of a merge and the job summary: what MergeResultsOperator logs, writes and returns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_batch_provider.cost.estimate import cost_rows

TOP_ERRORS = 5
EXAMPLE_IDS = 3  # custom_ids kept per error kind (and of truncated answers) in the summary


def keep_examples(kept: list[str], more: Iterable[str]) -> None:
    """Append custom_ids from ``more`` to ``kept`` until it holds :data:`EXAMPLE_IDS`."""
    for custom_id in more:
        if len(kept) >= EXAMPLE_IDS:
            return
        kept.append(custom_id)


@dataclass
class MergeStats:
    """Counters for one merge (one chunk, or a whole job once added up)."""

    rows: int = 0
    chunks: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    unmatched_results: int = 0
    requests_sent: int = 0  # requests in the chunks' first batches
    requests_resent: int = 0  # ... plus these, sent again in follow-up batches (line retries)
    batches: int = 0  # batches created, follow-ups included
    errors: Counter[str] = field(default_factory=Counter)  # failed rows per "status/code" (e.g. "errored/server_error")
    error_messages: dict[str, str] = field(default_factory=dict)  # the first message seen per "status/code"
    carried_rows: int = 0  # unchanged rows whose stored result was kept (skip_unchanged)
    new_input_tokens: int = 0  # tokens of rows sent in this run (what this run pays for)
    new_output_tokens: int = 0
    retried_rows: int = 0  # rows sent in more than one batch
    recovered_rows: int = 0  # ... that succeeded in the end
    error_examples: dict[str, list[str]] = field(default_factory=dict)  # "status/code" -> a few custom_ids
    truncated_rows: int = 0  # answers cut off at max_tokens (finish_reason "length"), whatever their status
    truncated_examples: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Return the rows whose final status is not ``succeeded``."""
        return self.rows - self.statuses.get("succeeded", 0)

    def add(self, other: MergeStats) -> None:
        """Add another merge's counters to these."""
        self.rows += other.rows
        self.chunks += other.chunks
        self.statuses.update(other.statuses)
        self.errors.update(other.errors)
        for kind, message in other.error_messages.items():
            self.error_messages.setdefault(kind, message)
        self.retried_rows += other.retried_rows
        self.carried_rows += other.carried_rows
        self.recovered_rows += other.recovered_rows
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.new_input_tokens += other.new_input_tokens
        self.new_output_tokens += other.new_output_tokens
        self.unmatched_results += other.unmatched_results
        self.requests_sent += other.requests_sent
        self.requests_resent += other.requests_resent
        self.batches += other.batches
        for kind, ids in other.error_examples.items():
            keep_examples(self.error_examples.setdefault(kind, []), ids)
        self.truncated_rows += other.truncated_rows
        keep_examples(self.truncated_examples, other.truncated_examples)

    def top_errors(self, count: int) -> list[list[Any]]:
        """Return the ``count`` most common failures as ``[["status/code: first message", rows], ...]``.

        Grouped by status and code, not by message: a message often quotes the answer (a cut-off
        JSON text), which would split one cause into thousands of buckets of one.
        """
        return [[self._label(kind), rows] for kind, rows in self.errors.most_common(count)]

    def _label(self, kind: str) -> str:
        message = self.error_messages.get(kind)
        return f"{kind}: {message}" if message else kind

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able summary."""
        top = [kind for kind, _ in self.errors.most_common(TOP_ERRORS)]
        return {
            "rows": self.rows,
            "chunks": self.chunks,
            "statuses": dict(sorted(self.statuses.items())),
            "succeeded": self.statuses.get("succeeded", 0),
            "failed": self.failed,
            "carried_rows": self.carried_rows,
            "retried_rows": self.retried_rows,
            "recovered_rows": self.recovered_rows,
            "top_errors": self.top_errors(TOP_ERRORS),
            # Keyed like top_errors' entries, so the run report can put the ids next to them.
            "error_examples": {self._label(kind): self.error_examples.get(kind, []) for kind in top},
            "truncated_rows": self.truncated_rows,
            "truncated_examples": list(self.truncated_examples),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "unmatched_results": self.unmatched_results,
            "requests_sent": self.requests_sent,
            "requests_resent": self.requests_resent,
            "batches": self.batches,
        }


def format_summary_table(summary: dict[str, Any], extra: Sequence[tuple[str, str]] = ()) -> str:
    """Render a merge summary (plus ``extra`` rows, e.g. the demo's) as a small aligned text table."""
    rows: list[tuple[str, str]] = [
        ("rows", f"{summary['rows']:,}"),
        ("chunks", f"{summary['chunks']:,}"),
        ("batches", f"{summary.get('batches', 0):,} (follow-ups included)"),
        ("requests sent", f"{summary['requests_sent']:,}"),
    ]
    if summary.get("requests_resent"):
        rows.append(("requests resent", f"{summary['requests_resent']:,} (line retries, in follow-up batches)"))
    # Always shown: a rerun that sends nothing must say why (rows kept from an earlier run).
    rows.append(("rows carried", f"{summary.get('carried_rows', 0):,} (stored results of an earlier run, not sent)"))
    rows += [(f"status {name}", f"{count:,}") for name, count in summary["statuses"].items()]
    if summary.get("retried_rows"):
        rows.append(("rows retried", f"{summary['retried_rows']:,} ({summary.get('recovered_rows', 0):,} recovered)"))
    if summary.get("truncated_rows"):
        rows.append(("cut off at max_tokens", f"{summary['truncated_rows']:,} (finish_reason=length)"))
    rows += [(f"error x{count:,}", what) for what, count in summary.get("top_errors", [])[:3]]
    rows += [
        ("input tokens", f"{summary['input_tokens']:,}"),
        ("output tokens", f"{summary['output_tokens']:,}"),
    ]
    rows += cost_rows(summary)
    if summary.get("output"):
        rows.append(("output", str(summary["output"])))
    rows += extra
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
