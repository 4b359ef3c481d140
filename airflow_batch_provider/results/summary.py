"""Counters of a merge and the job summary: what MergeResultsOperator logs, writes and returns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_batch_provider.cost.run_summary import cost_rows

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
    carried_batches: list[str] = field(default_factory=list)  # a few earlier batches whose stored results were kept
    cached_input_tokens: int = 0  # of new_input_tokens: read from the provider's prompt cache
    cache_write_tokens: int = 0  # ... and written to it

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
        self.cached_input_tokens += other.cached_input_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.unmatched_results += other.unmatched_results
        self.requests_sent += other.requests_sent
        self.requests_resent += other.requests_resent
        self.batches += other.batches
        for kind, ids in other.error_examples.items():
            keep_examples(self.error_examples.setdefault(kind, []), ids)
        self.truncated_rows += other.truncated_rows
        keep_examples(self.truncated_examples, other.truncated_examples)
        keep_examples(self.carried_batches, (b for b in other.carried_batches if b not in self.carried_batches))

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
            "carried_batches": list(self.carried_batches),
            "retried_rows": self.retried_rows,
            "recovered_rows": self.recovered_rows,
            "top_errors": self.top_errors(TOP_ERRORS),
            # Keyed like top_errors' entries, so the run report can put the ids next to them.
            "error_examples": {self._label(kind): self.error_examples.get(kind, []) for kind in top},
            "truncated_rows": self.truncated_rows,
            "truncated_examples": list(self.truncated_examples),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            # What this run's batches used (and were billed for): carried rows were paid for earlier.
            "new_input_tokens": self.new_input_tokens,
            "new_output_tokens": self.new_output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "unmatched_results": self.unmatched_results,
            "requests_sent": self.requests_sent,
            "requests_resent": self.requests_resent,
            "batches": self.batches,
        }


CHUNK_COUNTS_LIMIT = 10_000  # chunks whose merged counts the summary lists for the view (its XCom stays small)


def chunk_counts(per_chunk: Iterable[tuple[Mapping[str, Any], MergeStats]]) -> dict[str, Any]:
    """Return the merge's own per-chunk counts: ``{"job_dirs": [...], "chunks": [[dir, chunk, ok, failed, carried]]}``.

    ``dir`` indexes ``job_dirs`` (two jobs of one DAG run have chunks of the same index). The "LLM
    batches" view shows these once the merge ran, so its chunk lines add up to the run's totals (the
    merge also fails answers the provider counted as completed: cut off, not valid JSON).
    """
    job_dirs: dict[str, int] = {}
    chunks = []
    for batch, stats in per_chunk:
        where = job_dirs.setdefault(str(batch.get("job_dir", "")), len(job_dirs))
        counts = [stats.statuses.get("succeeded", 0), stats.failed, stats.carried_rows]
        chunks.append([where, int(batch["chunk_index"]), *counts])
    return {"job_dirs": list(job_dirs), "chunks": chunks[:CHUNK_COUNTS_LIMIT]}


def carried_note(summary: Mapping[str, Any]) -> str:
    """Say how many rows a run carried from an earlier one (``skip_unchanged``) and from which batches."""
    carried = int(summary.get("carried_rows") or 0)
    if not carried:
        return "0 (every row was sent in this run)"
    batches = [str(b) for b in summary.get("carried_batches") or [] if b]
    where = f"batch {', '.join(batches)}{' ...' if len(batches) >= EXAMPLE_IDS else ''} of " if batches else ""
    return f"{carried:,} (unchanged: the stored results of {where}an earlier run, paid for then; not sent again)"


def token_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Return the token rows: every row's tokens, and, when rows were carried, what this run's batches used."""
    rows = [("input tokens", f"{summary['input_tokens']:,}"), ("output tokens", f"{summary['output_tokens']:,}")]
    if summary.get("carried_rows") and "new_input_tokens" in summary:
        sent_in, sent_out = int(summary["new_input_tokens"] or 0), int(summary["new_output_tokens"] or 0)
        rows = [
            (name, f"{value} ({sent:,} in this run's batches; the rest in the carried rows)")
            for (name, value), sent in zip(rows, (sent_in, sent_out), strict=True)
        ]
    return rows


def format_summary_table(summary: Mapping[str, Any], extra: Sequence[tuple[str, str]] = ()) -> str:
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
    rows.append(("rows carried", carried_note(summary)))
    rows += [(f"status {name}", f"{count:,}") for name, count in summary["statuses"].items()]
    if summary.get("retried_rows"):
        rows.append(("rows retried", f"{summary['retried_rows']:,} ({summary.get('recovered_rows', 0):,} recovered)"))
    if summary.get("truncated_rows"):
        rows.append(("cut off at max_tokens", f"{summary['truncated_rows']:,} (finish_reason=length)"))
    rows += [(f"error x{count:,}", what) for what, count in summary.get("top_errors", [])[:3]]
    rows += token_rows(summary)
    rows += cost_rows(summary)
    if summary.get("output"):
        rows.append(("output", str(summary["output"])))
    rows += extra
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
