"""Join a chunk's results back onto its source rows and write one parquet part per chunk.

Memory is bounded by the chunk, not the job: each chunk's rows file (written by the chunk
step, in source order) and that chunk's results are joined, written to
``part-NNNNN.parquet`` through a temporary name, and dropped before the next chunk.
Re-running rewrites the same part files, so the dataset never holds a row twice.

A chunk may have been sent more than once (line retries, see
:mod:`airflow_batch_provider.batches.line_retry`): every attempt's results are read in order and, per
custom_id, the last attempt's result wins. The ``attempts`` column says how many batches
carried the row (1 = first try only; 0 = not sent this run: an unchanged row whose stored
result was carried over by ``skip_unchanged``, see :mod:`airflow_batch_provider.chunking.incremental`);
``batch_id`` names the batch whose result was kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_batch_provider.batches.line_retry import output_error_code, read_custom_ids, retry_path
from airflow_batch_provider.chunking.incremental import read_carried
from airflow_batch_provider.descriptors import RESULT_COLUMNS, CompletedBatch, ResultRecord
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.job_folder import OutputFolder
from airflow_batch_provider.results.structured import OutputValidator
from airflow_batch_provider.results.summary import MergeStats, keep_examples
from airflow_batch_provider.results.table import EMBEDDING, TEXT, concat_results, records_to_table, result_schema
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.utils.storage import atomic_write, to_path

log = logging.getLogger(__name__)

# Of a row's input tokens, the prompt cache's share: summed, not output columns (carried rows have none).
CACHE_COLUMNS = ("cached_input_tokens", "cache_write_tokens")
_PREFERENCE = {"succeeded": 0, "invalid_output": 1, "errored": 2, "expired": 3, "canceled": 4, "missing": 5}


class PartSink(Protocol):
    """Somewhere else each merged part goes (idempotently: upsert on custom_id)."""

    def write_part(self, table: pa.Table, chunk_index: int) -> int:
        """Write one merged part; return the rows written."""
        ...


@dataclass
class ChunkResults:
    """Every result a chunk's attempts returned, ranked, plus who was sent again.

    ``results`` has the result columns (:data:`~airflow_batch_provider.results.table.RESULT_FIELDS`)
    plus ``batch_id`` and ``attempt`` (0 = carried over by ``skip_unchanged``, 1 = first batch,
    2+ = follow-ups), ordered so that the first row for a custom_id is the one to keep: the
    latest attempt, then the most useful status (succeeded before invalid_output, errored,
    expired, canceled), then file order. ``resent`` lists the custom_ids of each follow-up's
    requests file, latest attempt first, with ``attempt`` and ``batch_id``: a row sent again
    but not answered keeps its earlier result yet counts the attempt.
    """

    results: pa.Table
    resent: pa.Table

    @classmethod
    def from_records(cls, records: Iterable[ResultRecord], batch_id: str, endpoint: str = "") -> ChunkResults:
        """Return the results of one batch (first attempt) given as records, e.g. in tests."""
        table = _tagged(records_to_table(records, _response_type(endpoint)), batch_id, 1)
        return cls(rank_results(table), _no_resent())


def rank_results(results: pa.Table) -> pa.Table:
    """Order ``results`` so that the result to keep for each custom_id is its first row (a stable sort)."""
    if results.num_rows < 2:
        return results
    ranked = pa.array(list(_PREFERENCE), type=pa.string())  # the most useful status first
    usefulness = pc.index_in(results.column("status"), value_set=ranked)
    keys = results.append_column("_usefulness", usefulness)
    order = pc.sort_indices(keys, sort_keys=[("attempt", "descending"), ("_usefulness", "ascending")])
    return results.take(order)


def _response_type(endpoint: str) -> pa.DataType:
    return EMBEDDING if endpoint == "/v1/embeddings" else TEXT


def _first(rows: pa.ChunkedArray, values: pa.Table) -> tuple[pa.Array, pa.Table]:
    """Return (position in ``values`` of each row's first match or null, those rows of ``values``)."""
    where = pc.index_in(rows, value_set=values.column("custom_id"))
    return where, values.take(where)


def _count(mask: pa.Array) -> int:
    return int(pc.sum(pc.cast(pc.fill_null(mask, False), pa.int64())).as_py() or 0)


def _total(values: pa.Array, mask: pa.Array | None = None) -> int:
    if mask is not None:
        values = values.filter(pc.fill_null(mask, False))
    return int(pc.sum(values).as_py() or 0)


def join_results(
    rows: pa.Table,
    chunk: ChunkResults,
    batch_id: str,
    endpoint: str,
    validator: OutputValidator | None = None,
) -> tuple[pa.Table, MergeStats]:
    """Return ``rows`` with the result columns appended, one output row per input row.

    Each row takes the first result of its custom_id in ``chunk.results`` (see
    :class:`ChunkResults`); a row with none is ``missing``. ``batch_id`` names the batch of a
    row that no batch answered and no follow-up resent. With a ``validator`` (structured
    output), each succeeded answer is parsed and checked: its fields become columns, and an
    answer that does not validate turns the row's status into ``invalid_output`` with the
    reason in ``error``.
    """
    for name in RESULT_COLUMNS:
        if name in rows.column_names:  # the chunk step refuses these; a rows file from elsewhere may not
            raise ResultsError(
                f"The source table has a column named {name!r}, which the merged output uses; rename it."
            )
    ids = rows.column("custom_id")
    where, kept = _first(ids, chunk.results)
    _, resent = _first(ids, chunk.resent)
    answered = pc.is_valid(where)
    row_batch = pc.coalesce(kept.column("batch_id"), resent.column("batch_id"), pa.scalar(batch_id))
    tries = pc.coalesce(
        pc.max_element_wise(kept.column("attempt"), resent.column("attempt"), skip_nulls=True),
        pa.scalar(1, pa.int32()),
    )
    error = kept.column("error")
    if where.null_count:  # rows no batch answered: say which batch they were sent in
        missing_error = pc.binary_join_element_wise("no result line for this custom_id in batch ", row_batch, "")
        error = pc.if_else(answered, error, missing_error)
    columns: dict[str, Any] = {
        "status": pc.coalesce(kept.column("status"), pa.scalar("missing")),
        "response": kept.column("response"),
        "finish_reason": kept.column("finish_reason"),
        "error": error,
        "input_tokens": kept.column("input_tokens"),
        "output_tokens": kept.column("output_tokens"),
        "batch_id": row_batch,
        "attempts": pc.cast(tries, pa.int32()),
    }
    error_code = kept.column("error_code")
    parsed: dict[str, pa.Array] = {}
    if validator is not None:
        columns["status"], columns["error"], error_code, parsed = _validate(
            validator, columns["status"], columns["response"], columns["error"], error_code, columns["finish_reason"]
        )
    columns["error_code"] = _output_codes(columns["status"], error_code, kept.column("http_status"))
    table = rows
    for name in RESULT_COLUMNS:
        table = table.append_column(name, columns[name])
    for name, values in parsed.items():
        table = table.append_column(name, values)
    stats = _stats(table, chunk.results, ids)
    stats.cached_input_tokens, stats.cache_write_tokens = (_total(kept.column(c)) for c in CACHE_COLUMNS)
    return table, stats


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _output_codes(status: pa.Array, error_code: pa.Array, http_status: pa.Array) -> pa.Array:
    """Return each row's output ``error_code`` (see :func:`.line_retry.output_error_code`)."""
    status, error_code, http_status = _flat(status), _flat(error_code), _flat(http_status)
    failed = pc.fill_null(pc.not_equal(status, "succeeded"), False)
    where = pc.indices_nonzero(failed)
    codes = pa.nulls(len(status), pa.string())
    if not len(where):
        return codes
    found = zip(status.take(where).to_pylist(), error_code.take(where).to_pylist(), http_status.take(where).to_pylist())
    values = [output_error_code({"status": s, "error_code": c, "http_status": h}) for s, c, h in found]  # type: ignore[typeddict-item]
    return pc.replace_with_mask(codes, failed, pa.array(values, pa.string()))


def _validate(
    validator: OutputValidator,
    status: pa.Array,
    response: pa.Array,
    error: pa.Array,
    error_code: pa.Array,
    finish_reason: pa.Array,
) -> tuple[pa.Array, pa.Array, pa.Array, dict[str, pa.Array]]:
    """Parse and check every succeeded answer: return the new status, error, error_code and parsed columns.

    An answer cut off at max_tokens says so: code ``truncated`` and ``finish_reason=length`` in the error.
    """
    statuses, answers = status.to_pylist(), response.to_pylist()
    errors, codes = error.to_pylist(), error_code.to_pylist()
    finished = finish_reason.to_pylist()
    parsed: dict[str, list[Any]] = {col: [None] * len(statuses) for col, _ in validator.columns.values()}
    for i, current in enumerate(statuses):
        if current != "succeeded":
            continue
        values, reason = validator.parse(answers[i])
        if values is None:
            statuses[i], errors[i], codes[i] = "invalid_output", reason, "schema"
            if finished[i] == "length":
                errors[i] = f"answer cut off at max_tokens (finish_reason=length); raise max_tokens: {reason}"
                codes[i] = "truncated"
            continue
        for col in parsed:
            parsed[col][i] = values.get(col)
    types = dict(validator.columns.values())
    return (
        pa.array(statuses, pa.string()),
        pa.array(errors, pa.string()),
        pa.array(codes, pa.string()),
        {col: pa.array(values, type=types[col]) for col, values in parsed.items()},
    )


def _stats(table: pa.Table, results: pa.Table, ids: pa.ChunkedArray) -> MergeStats:
    """Count one merged chunk: statuses, tokens (all, and this run's), retries, truncations and failures."""
    status, tries = table.column("status"), table.column("attempts")
    stats = MergeStats(rows=table.num_rows, chunks=1)
    counts = pc.value_counts(status)
    stats.statuses.update(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))
    sent_now = pc.greater(tries, 0)  # 0: a carried, unchanged row
    stats.input_tokens = _total(table.column("input_tokens"))
    stats.output_tokens = _total(table.column("output_tokens"))
    stats.new_input_tokens = _total(table.column("input_tokens"), sent_now)
    stats.new_output_tokens = _total(table.column("output_tokens"), sent_now)
    carried_from = pc.unique(table.column("batch_id").filter(pc.invert(pc.fill_null(sent_now, True))))
    keep_examples(stats.carried_batches, (b for b in carried_from.to_pylist() if b))
    retried = pc.greater(tries, 1)
    stats.retried_rows = _count(retried)
    stats.recovered_rows = _count(pc.and_(retried, pc.equal(status, "succeeded")))
    truncated = pc.equal(table.column("finish_reason"), "length")
    stats.truncated_rows = _count(truncated)
    if stats.truncated_rows:
        keep_examples(stats.truncated_examples, ids.filter(pc.fill_null(truncated, False)).to_pylist())
    failed = pc.not_equal(status, "succeeded")
    if _count(failed):
        details = table.select(["custom_id", "status", "error_code", "error"]).filter(failed).to_pylist()
        for row in details:
            kind = f"{row['status']}/{row['error_code'] or '-'}"  # not the message: it may quote the answer
            stats.errors[kind] += 1
            keep_examples(stats.error_examples.setdefault(kind, []), [row["custom_id"]])
            if kind not in stats.error_messages and row["error"]:
                stats.error_messages[kind] = _short(row["error"])
    answered_ids = pc.unique(results.column("custom_id"))
    stats.unmatched_results = len(answered_ids) - _count(pc.is_in(answered_ids, value_set=ids))
    return stats


def _short(message: str, limit: int = 120) -> str:
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def chunk_attempts(batch: Mapping[str, Any]) -> list[BatchState]:
    """Return the states of every attempt of a chunk, first to last (just ``state`` for older records)."""
    states = batch.get("attempts") or ([batch["state"]] if batch.get("state") else [])
    return [BatchState.from_dict(s) for s in states]


def _tagged(table: pa.Table, batch_id: str, attempt: int) -> pa.Table:
    count = table.num_rows
    if "batch_id" not in table.column_names:
        table = table.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.string()), count))
    return table.append_column("attempt", pa.repeat(pa.scalar(attempt, pa.int32()), count))


def collect_attempts(hook: BatchHook | None, batch: Mapping[str, Any], endpoint: str = "") -> ChunkResults:
    """Read every attempt's results (and the carried ones) of a chunk, ranked; see :class:`ChunkResults`.

    Follow-up requests files that are gone only make ``attempts`` count from the results.
    """
    response_type = _response_type(endpoint or batch.get("endpoint", ""))
    schema = result_schema(response_type)
    parts: list[pa.Table] = []
    resent: list[pa.Table] = []
    if batch.get("carry_path"):  # unchanged rows (skip_unchanged): stored results, not sent this run
        carried = read_carried(batch["carry_path"])
        parts.append(_tagged(carried.cast(schema.append(pa.field("batch_id", pa.string()))), "", 0))
    for number, state in enumerate(chunk_attempts(batch), 1):
        assert hook is not None, "a chunk with attempts needs a hook to read them"
        found = _read_results(hook, state, response_type, batch["label"])
        parts.append(_tagged(found, state.batch_id, number))
        if number > 1:
            path = retry_path(batch["job_dir"], batch["chunk_index"], number)
            try:
                sent = read_custom_ids(path)
            except FileNotFoundError:
                log.warning("%s: %s is gone; attempts are counted from the results alone", batch["label"], path)
                continue
            resent.insert(0, _tagged(pa.table({"custom_id": pa.array(sent, pa.string())}), state.batch_id, number))
    results = pa.concat_tables(parts) if parts else _tagged(schema.empty_table(), "", 0)
    return ChunkResults(rank_results(results), pa.concat_tables(resent) if resent else _no_resent())


# What a result that does not parse raises, besides ResultsError: Arrow conversions and plain value errors.
_PARSE_ERRORS = (pa.ArrowException, ValueError, TypeError, KeyError, UnicodeDecodeError)


def _read_results(hook: BatchHook, state: BatchState, response_type: pa.DataType, label: str) -> pa.Table:
    """Read one batch's results; wrap any parsing failure in ResultsError naming the chunk, batch and line."""
    tables: list[pa.Table] = []
    lines_before = 0  # result lines (one row each) in the blocks already read
    try:
        for table in hook.iter_result_tables(state, response_type):
            tables.append(table)
            lines_before += table.num_rows
    except ResultsError as exc:
        where = f" at result line {lines_before + exc.line}" if exc.line is not None else ""
        raise ResultsError(_unreadable(label, state.batch_id, where, exc), line=exc.line) from exc
    except _PARSE_ERRORS as exc:
        where = f" after result line {lines_before}"
        raise ResultsError(_unreadable(label, state.batch_id, where, f"{type(exc).__name__}: {exc}")) from exc
    return concat_results(tables, response_type)


def _unreadable(label: str, batch_id: str, where: str, reason: object) -> str:
    return (
        f"{label}: results of batch {batch_id} are unreadable{where}: {reason}. The batch is paid for and its "
        "results stay with the provider: fix what is named here (or report it), then clear the merge task."
    )


def _no_resent() -> pa.Table:
    return _tagged(pa.table({"custom_id": pa.array([], pa.string())}), "", 0)


def merge_chunk(
    hook: BatchHook, batch: CompletedBatch | Mapping[str, Any], output_dir: str, sink: PartSink | None = None
) -> MergeStats:
    """Merge one chunk: stream every attempt's results, join onto its rows file, write its part file.

    With a ``sink`` (e.g. :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink`) the same part is
    also upserted there, in one transaction, after the parquet part is in place.
    """
    state = batch.get("state")
    first_batch_id = str(state["batch_id"]) if state else ""
    chunk = collect_attempts(hook, batch)
    with to_path(batch["rows_path"]).open("rb") as handle:
        rows = pq.ParquetFile(handle).read()
    validator = None
    if batch.get("schema_path"):
        validator = OutputValidator.from_file(batch["schema_path"], set(rows.column_names) | set(RESULT_COLUMNS))
    table, stats = join_results(rows, chunk, first_batch_id, batch["endpoint"], validator)
    stats.requests_sent = batch["num_requests"]
    stats.requests_resent = chunk.resent.num_rows
    stats.batches = len(chunk_attempts(batch))
    stats.carried_rows = int(batch.get("num_carried", 0))
    if stats.unmatched_results:
        log.warning(
            "%s: %d result line(s) in batch(es) %s match no row of this chunk; they were ignored",
            batch["label"],
            stats.unmatched_results,
            ", ".join(s.batch_id for s in chunk_attempts(batch)),
        )
    with atomic_write(str(OutputFolder(output_dir).part(batch["chunk_index"]))) as out:
        pq.write_table(table, out, compression="zstd")
    if sink is not None:
        sink.write_part(table, batch["chunk_index"])
    return stats


def remove_stale_parts(output_dir: str, keep: Sequence[str]) -> list[str]:
    """Delete part files this merge did not write (a job that shrank) and temporaries of a killed one."""
    output = OutputFolder(output_dir)
    removed: list[str] = []
    if not output.path.exists():
        return removed
    for path in output.path.iterdir():
        stale_part = output.is_part(path.name) and path.name not in keep
        # A merge killed while writing left a temporary; readers skip it, we remove it.
        if stale_part or output.is_unfinished_part(path.name):
            path.unlink()
            removed.append(path.name)
    return removed
