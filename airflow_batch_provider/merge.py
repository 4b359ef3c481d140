"""Join a chunk's results back onto its source rows and write one parquet part per chunk.

Memory is bounded by the chunk, not the job: each chunk's rows file (written by the chunk
step, in source order) and that chunk's results are joined, written to
``part-NNNNN.parquet`` through a temporary name, and dropped before the next chunk.
Re-running rewrites the same part files, so the dataset never holds a row twice.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_batch_provider.descriptors import CompletedBatch, ResultRecord
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.storage import atomic_write, join, to_path
from airflow_batch_provider.structured import OutputValidator

log = logging.getLogger(__name__)

RESULT_COLUMNS = (
    "status",
    "response",
    "finish_reason",
    "error",
    "input_tokens",
    "output_tokens",
    "batch_id",
)
SUMMARY_FILE = "_SUMMARY.json"
_PREFERENCE = {"succeeded": 0, "invalid_output": 1, "errored": 2, "expired": 3, "canceled": 4, "missing": 5}


def part_name(chunk_index: int) -> str:
    """Return the deterministic file name of a chunk's output part."""
    return f"part-{chunk_index:05d}.parquet"


@dataclass
class MergeStats:
    """Counters for one merge (one chunk, or a whole job once added up)."""

    rows: int = 0
    chunks: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    unmatched_results: int = 0
    requests_sent: int = 0

    def add(self, other: MergeStats) -> None:
        """Add another merge's counters to these."""
        self.rows += other.rows
        self.chunks += other.chunks
        self.statuses.update(other.statuses)
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.unmatched_results += other.unmatched_results
        self.requests_sent += other.requests_sent

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able summary."""
        return {
            "rows": self.rows,
            "chunks": self.chunks,
            "statuses": dict(sorted(self.statuses.items())),
            "succeeded": self.statuses.get("succeeded", 0),
            "failed": self.rows - self.statuses.get("succeeded", 0),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "unmatched_results": self.unmatched_results,
            "requests_sent": self.requests_sent,
        }


def collect_results(records: Iterable[ResultRecord]) -> dict[str, ResultRecord]:
    """Index results by custom_id; when one id appears twice, keep the most useful result."""
    by_id: dict[str, ResultRecord] = {}
    for rec in records:
        old = by_id.get(rec["custom_id"])
        if old is None or _PREFERENCE[rec["status"]] < _PREFERENCE[old["status"]]:
            by_id[rec["custom_id"]] = rec
    return by_id


def _response_type(endpoint: str) -> pa.DataType:
    return pa.list_(pa.float32()) if endpoint == "/v1/embeddings" else pa.string()


def join_results(
    rows: pa.Table,
    results: dict[str, ResultRecord],
    batch_id: str,
    endpoint: str,
    validator: OutputValidator | None = None,
) -> tuple[pa.Table, MergeStats]:
    """Return ``rows`` with the result columns appended, one output row per input row.

    With a ``validator`` (structured output), each succeeded answer is parsed and checked:
    its fields become columns, and an answer that does not validate turns the row's status
    into ``invalid_output`` with the reason in ``error``.
    """
    ids = rows.column("custom_id").to_pylist()
    parsed: dict[str, list[Any]] = {col: [] for col, _ in validator.columns.values()} if validator else {}
    stats = MergeStats(rows=len(ids), chunks=1)
    missing_msg = f"no result line for this custom_id in batch {batch_id}"
    columns: dict[str, list[Any]] = {name: [] for name in RESULT_COLUMNS}
    for custom_id in ids:
        rec = results.get(custom_id)
        if rec is None:
            columns["status"].append("missing")
            columns["response"].append(None)
            columns["finish_reason"].append(None)
            columns["error"].append(missing_msg)
            columns["input_tokens"].append(None)
            columns["output_tokens"].append(None)
            values = None
        else:
            status, error = rec["status"], rec["error"]
            values = None
            if validator is not None and status == "succeeded":
                values, reason = validator.parse(rec["response"])
                if values is None:
                    status, error = "invalid_output", reason
            columns["status"].append(status)
            columns["response"].append(rec["response"])
            columns["finish_reason"].append(rec["finish_reason"])
            columns["error"].append(error)
            columns["input_tokens"].append(rec["input_tokens"])
            columns["output_tokens"].append(rec["output_tokens"])
            stats.input_tokens += rec["input_tokens"] or 0
            stats.output_tokens += rec["output_tokens"] or 0
        columns["batch_id"].append(batch_id)
        for col in parsed:
            parsed[col].append(values.get(col) if values else None)
    stats.statuses.update(columns["status"])
    stats.unmatched_results = len(results.keys() - set(ids))
    types = {
        "status": pa.string(),
        "response": _response_type(endpoint),
        "finish_reason": pa.string(),
        "error": pa.string(),
        "input_tokens": pa.int64(),
        "output_tokens": pa.int64(),
        "batch_id": pa.string(),
    }
    table = rows
    for name in RESULT_COLUMNS:
        if name in table.column_names:  # a source column of the same name would be ambiguous
            raise ResultsError(
                f"The source table has a column named {name!r}, which the merged output uses; rename it."
            )
        table = table.append_column(name, pa.array(columns[name], type=types[name]))
    if validator is not None:
        for col, dtype in validator.columns.values():
            table = table.append_column(col, pa.array(parsed[col], type=dtype))
    return table, stats


def merge_chunk(hook: BatchHook, batch: CompletedBatch, output_dir: str) -> MergeStats:
    """Merge one chunk: stream its results, join onto its rows file, write its part file."""
    state = BatchState.from_dict(batch["state"])
    try:
        results = collect_results(hook.iter_results(state))
    except ResultsError as exc:
        raise ResultsError(f"{batch['label']}: results of batch {state.batch_id} are unreadable: {exc}") from exc
    with to_path(batch["rows_path"]).open("rb") as handle:
        rows = pq.read_table(handle)
    validator = None
    if batch.get("schema_path"):
        validator = OutputValidator.from_file(batch["schema_path"], set(rows.column_names) | set(RESULT_COLUMNS))
    table, stats = join_results(rows, results, state.batch_id, batch["endpoint"], validator)
    stats.requests_sent = batch["num_requests"]
    if stats.unmatched_results:
        log.warning(
            "%s: %d result line(s) in batch %s match no row of this chunk; they were ignored",
            batch["label"],
            stats.unmatched_results,
            state.batch_id,
        )
    with atomic_write(join(output_dir, part_name(batch["chunk_index"]))) as out:
        pq.write_table(table, out, compression="zstd")
    return stats


def remove_stale_parts(output_dir: str, keep: Sequence[str]) -> list[str]:
    """Delete part files in ``output_dir`` that this merge did not write (a job that shrank)."""
    folder = to_path(output_dir)
    removed: list[str] = []
    if not folder.exists():
        return removed
    for path in folder.iterdir():
        if path.name.startswith("part-") and path.name.endswith(".parquet") and path.name not in keep:
            path.unlink()
            removed.append(path.name)
    return removed


def format_summary_table(summary: dict[str, Any]) -> str:
    """Render a merge summary as a small aligned text table for the task log."""
    rows: list[tuple[str, str]] = [
        ("rows", f"{summary['rows']:,}"),
        ("chunks", f"{summary['chunks']:,}"),
        ("requests sent", f"{summary['requests_sent']:,}"),
    ]
    rows += [(f"status {name}", f"{count:,}") for name, count in summary["statuses"].items()]
    rows += [
        ("input tokens", f"{summary['input_tokens']:,}"),
        ("output tokens", f"{summary['output_tokens']:,}"),
    ]
    if summary.get("output"):
        rows.append(("output", str(summary["output"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
