"""Join a chunk's results back onto its source rows and write one parquet part per chunk.

Memory is bounded by the chunk, not the job: each chunk's rows file (written by the chunk
step, in source order) and that chunk's results are joined, written to
``part-NNNNN.parquet`` through a temporary name, and dropped before the next chunk.
Re-running rewrites the same part files, so the dataset never holds a row twice.

A chunk may have been sent more than once (line retries, see
:mod:`airflow_batch_provider.line_retry`): every attempt's results are read in order and, per
custom_id, the last attempt's result wins. The ``attempts`` column says how many batches
carried the row (1 = first try only; 0 = not sent this run: an unchanged row whose stored
result was carried over by ``skip_unchanged``, see :mod:`airflow_batch_provider.incremental`);
``batch_id`` names the batch whose result was kept.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_batch_provider.cost import cost_rows
from airflow_batch_provider.descriptors import CompletedBatch, ResultRecord
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.incremental import read_carried
from airflow_batch_provider.line_retry import describe_failure, read_custom_ids, retry_path
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
    "attempts",
)
SUMMARY_FILE = "_SUMMARY.json"
TOP_ERRORS = 5
_PREFERENCE = {"succeeded": 0, "invalid_output": 1, "errored": 2, "expired": 3, "canceled": 4, "missing": 5}


class PartSink(Protocol):
    """Somewhere else each merged part goes (idempotently: upsert on custom_id)."""

    def write_part(self, table: pa.Table, chunk_index: int) -> int:
        """Write one merged part; return the rows written."""
        ...


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
    errors: Counter[str] = field(default_factory=Counter)  # "status/code: message" of every failed row
    carried_rows: int = 0  # unchanged rows whose stored result was kept (skip_unchanged)
    new_input_tokens: int = 0  # tokens of rows sent in this run (what this run pays for)
    new_output_tokens: int = 0
    retried_rows: int = 0  # rows sent in more than one batch
    recovered_rows: int = 0  # ... that succeeded in the end

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
        self.retried_rows += other.retried_rows
        self.carried_rows += other.carried_rows
        self.recovered_rows += other.recovered_rows
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.new_input_tokens += other.new_input_tokens
        self.new_output_tokens += other.new_output_tokens
        self.unmatched_results += other.unmatched_results
        self.requests_sent += other.requests_sent

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able summary."""
        return {
            "rows": self.rows,
            "chunks": self.chunks,
            "statuses": dict(sorted(self.statuses.items())),
            "succeeded": self.statuses.get("succeeded", 0),
            "failed": self.failed,
            "carried_rows": self.carried_rows,
            "retried_rows": self.retried_rows,
            "recovered_rows": self.recovered_rows,
            "top_errors": [[what, count] for what, count in self.errors.most_common(TOP_ERRORS)],
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
    *,
    batch_ids: Mapping[str, str] | None = None,
    attempts: Mapping[str, int] | None = None,
) -> tuple[pa.Table, MergeStats]:
    """Return ``rows`` with the result columns appended, one output row per input row.

    With a ``validator`` (structured output), each succeeded answer is parsed and checked:
    its fields become columns, and an answer that does not validate turns the row's status
    into ``invalid_output`` with the reason in ``error``. ``batch_ids`` names, per custom_id,
    the batch a kept result came from (default ``batch_id``); ``attempts`` how many batches
    carried the row (default 1).
    """
    ids = rows.column("custom_id").to_pylist()
    parsed: dict[str, list[Any]] = {col: [] for col, _ in validator.columns.values()} if validator else {}
    stats = MergeStats(rows=len(ids), chunks=1)
    batch_ids = batch_ids or {}
    attempts = attempts or {}
    columns: dict[str, list[Any]] = {name: [] for name in RESULT_COLUMNS}
    for custom_id in ids:
        rec = results.get(custom_id)
        row_batch = batch_ids.get(custom_id, batch_id)
        tries = attempts.get(custom_id, 1)
        values = None
        if rec is None:
            rec = {
                "custom_id": custom_id,
                "status": "missing",
                "response": None,
                "finish_reason": None,
                "error": f"no result line for this custom_id in batch {row_batch}",
                "error_code": None,
                "http_status": None,
                "input_tokens": None,
                "output_tokens": None,
            }
        elif validator is not None and rec["status"] == "succeeded":
            values, reason = validator.parse(rec["response"])
            if values is None:
                rec = {**rec, "status": "invalid_output", "error": reason, "error_code": "schema"}
        status = rec["status"]
        columns["status"].append(status)
        columns["response"].append(rec["response"])
        columns["finish_reason"].append(rec["finish_reason"])
        columns["error"].append(rec["error"])
        columns["input_tokens"].append(rec["input_tokens"])
        columns["output_tokens"].append(rec["output_tokens"])
        columns["batch_id"].append(row_batch)
        columns["attempts"].append(tries)
        stats.input_tokens += rec["input_tokens"] or 0
        stats.output_tokens += rec["output_tokens"] or 0
        if tries > 0:  # sent in this run (0: a carried, unchanged row)
            stats.new_input_tokens += rec["input_tokens"] or 0
            stats.new_output_tokens += rec["output_tokens"] or 0
        if status != "succeeded":
            stats.errors[describe_failure(rec)] += 1
        if tries > 1:
            stats.retried_rows += 1
            stats.recovered_rows += status == "succeeded"
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
        "attempts": pa.int32(),
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


def chunk_attempts(batch: Mapping[str, Any]) -> list[BatchState]:
    """Return the states of every attempt of a chunk, first to last (just ``state`` for older records)."""
    states = batch.get("attempts") or ([batch["state"]] if batch.get("state") else [])
    return [BatchState.from_dict(s) for s in states]


def collect_attempts(
    hook: BatchHook, batch: Mapping[str, Any]
) -> tuple[dict[str, ResultRecord], dict[str, str], dict[str, int]]:
    """Read every attempt's results in order; the last result per custom_id wins.

    Return (results, batch id of each kept result, number of batches that carried each id).
    Follow-up requests files that are gone only make ``attempts`` count from the results.
    """
    results: dict[str, ResultRecord] = {}
    batch_of: dict[str, str] = {}
    tries: dict[str, int] = {}
    if batch.get("carry_path"):  # unchanged rows (skip_unchanged): stored results, not sent this run
        for custom_id, (record, stored_batch) in read_carried(batch["carry_path"]).items():
            results[custom_id] = record
            batch_of[custom_id] = stored_batch
            tries[custom_id] = 0
    for number, state in enumerate(chunk_attempts(batch), 1):
        try:
            found = collect_results(hook.iter_results(state))
        except ResultsError as exc:
            raise ResultsError(f"{batch['label']}: results of batch {state.batch_id} are unreadable: {exc}") from exc
        for custom_id, record in found.items():
            results[custom_id] = record
            batch_of[custom_id] = state.batch_id
            tries[custom_id] = number
        if number > 1:
            path = retry_path(batch["job_dir"], batch["chunk_index"], number)
            try:
                sent = read_custom_ids(path)
            except FileNotFoundError:
                log.warning("%s: %s is gone; attempts are counted from the results alone", batch["label"], path)
                continue
            for custom_id in sent:  # a row sent again but not answered keeps its earlier result
                tries[custom_id] = number
                if custom_id not in results:
                    batch_of[custom_id] = state.batch_id
    return results, batch_of, tries


def merge_chunk(
    hook: BatchHook, batch: CompletedBatch | Mapping[str, Any], output_dir: str, sink: PartSink | None = None
) -> MergeStats:
    """Merge one chunk: stream every attempt's results, join onto its rows file, write its part file.

    With a ``sink`` (e.g. :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink`) the same part is
    also upserted there, in one transaction, after the parquet part is in place.
    """
    state = batch.get("state")
    first_batch_id = str(state["batch_id"]) if state else ""
    results, batch_of, tries = collect_attempts(hook, batch)
    with to_path(batch["rows_path"]).open("rb") as handle:
        rows = pq.read_table(handle)
    validator = None
    if batch.get("schema_path"):
        validator = OutputValidator.from_file(batch["schema_path"], set(rows.column_names) | set(RESULT_COLUMNS))
    table, stats = join_results(
        rows, results, first_batch_id, batch["endpoint"], validator, batch_ids=batch_of, attempts=tries
    )
    stats.requests_sent = batch["num_requests"]
    stats.carried_rows = int(batch.get("num_carried", 0))
    if stats.unmatched_results:
        log.warning(
            "%s: %d result line(s) in batch(es) %s match no row of this chunk; they were ignored",
            batch["label"],
            stats.unmatched_results,
            ", ".join(s.batch_id for s in chunk_attempts(batch)),
        )
    with atomic_write(join(output_dir, part_name(batch["chunk_index"]))) as out:
        pq.write_table(table, out, compression="zstd")
    if sink is not None:
        sink.write_part(table, batch["chunk_index"])
    return stats


def remove_stale_parts(output_dir: str, keep: Sequence[str]) -> list[str]:
    """Delete part files this merge did not write (a job that shrank) and temporaries of a killed one."""
    folder = to_path(output_dir)
    removed: list[str] = []
    if not folder.exists():
        return removed
    for path in folder.iterdir():
        stale_part = path.name.startswith("part-") and path.name.endswith(".parquet") and path.name not in keep
        # ".part-NNNNN.parquet.<id>.tmp": a merge killed while writing; readers skip it, we remove it.
        leftover = path.name.startswith(".part-") and path.name.endswith(".tmp")
        if stale_part or leftover:
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
    if summary.get("carried_rows"):
        rows.append(("unchanged (kept)", f"{summary['carried_rows']:,}"))
    rows += [(f"status {name}", f"{count:,}") for name, count in summary["statuses"].items()]
    if summary.get("retried_rows"):
        rows.append(("rows retried", f"{summary['retried_rows']:,} ({summary.get('recovered_rows', 0):,} recovered)"))
    rows += [(f"error x{count:,}", what) for what, count in summary.get("top_errors", [])[:3]]
    rows += [
        ("input tokens", f"{summary['input_tokens']:,}"),
        ("output tokens", f"{summary['output_tokens']:,}"),
    ]
    rows += cost_rows(summary)
    if summary.get("output"):
        rows.append(("output", str(summary["output"])))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
