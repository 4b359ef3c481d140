"""Incremental reprocessing: send only the rows whose request changed since the last stored result.

Every row carries a ``request_fingerprint`` (provider, endpoint and the rendered request without
its custom_id). With ``skip_unchanged=True`` the chunk step compares each row with the previous
merged output: a row whose custom_id already has a *final* result for the same fingerprint is
*carried*: its stored result is copied to the chunk's carry file and its request is dropped
from the chunk's requests file, both in the chunk step's staging folder, before the manifest is
written and the folder published (:mod:`airflow_batch_provider.chunking.staging`).

Which stored results are final is set per status by ``carry_statuses`` (default
:data:`DEFAULT_CARRY_STATUSES`): the same request sent again would give the same answer, so
sending it again only pays twice.

- ``succeeded``: the answer.
- ``invalid_output``: an answer that failed the response schema (often cut off at max_tokens);
  at temperature 0 the same request comes back the same. Change the request (a higher
  ``max_tokens``, a new prompt) and its fingerprint changes, so it is sent again.
- ``errored``, only when the error is final (a 400-class ``invalid_request_error``, an
  authentication error: see :func:`~airflow_batch_provider.batches.line_retry.is_final_error_code`).
  A retryable error (5xx, 429, ``server_error`` ...) or one without a code is never carried.
- ``expired``, ``canceled`` and ``missing`` rows were never answered: never carried.

The merge step puts carried results back, so the output still has one row per input row. A
prompt change alters every fingerprint, so every row is sent again; new rows have no stored
result, so only they are sent.

The previous output is read before the merge overwrites it, so a crash in between loses nothing:
the carry files hold the copies. Memory: the previous output's key columns plus the carried
results of one chunk at a time.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_batch_provider.batches.line_retry import is_final_error_code
from airflow_batch_provider.descriptors import RESULT_COLUMNS, ChunkDescriptor
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.job_folder import ChunkFiles, OutputFolder
from airflow_batch_provider.utils.storage import AnyPath, to_path

log = logging.getLogger(__name__)

# A carried row keeps its stored result; ``attempts`` is counted afresh by this run's merge.
CARRIED_COLUMNS = tuple(column for column in RESULT_COLUMNS if column != "attempts")
#: Statuses whose stored result ``skip_unchanged`` keeps by default (``errored``: final errors only).
DEFAULT_CARRY_STATUSES = ("succeeded", "invalid_output", "errored")
CARRYABLE_STATUSES = frozenset(DEFAULT_CARRY_STATUSES)


def check_carry_statuses(statuses: Collection[str]) -> frozenset[str]:
    """Return ``statuses`` as a set; raise InvalidInputError for one that can never be carried."""
    chosen = frozenset(statuses) if not isinstance(statuses, str) else frozenset({statuses})
    wrong = sorted(chosen - CARRYABLE_STATUSES)
    if wrong or not chosen:
        raise InvalidInputError(
            f"carry_statuses={sorted(chosen)!r}: choose among {sorted(CARRYABLE_STATUSES)} "
            f"(default {list(DEFAULT_CARRY_STATUSES)}). Rows that were never answered (expired, canceled, "
            "missing) or failed retryably are always sent again."
        )
    return chosen


@dataclass(frozen=True)
class SkipStats:
    """What the incremental pass decided."""

    rows: int
    carried: int

    @property
    def sent(self) -> int:
        """Return the rows that still go to the provider."""
        return self.rows - self.carried


def _keys(table: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(
        pc.cast(table.column("custom_id"), pa.string()), table.column("request_fingerprint"), "\x1f"
    )


def _final(table: pa.Table, statuses: frozenset[str]) -> pa.Array:
    """Return which stored rows are final results under ``statuses`` (see the module docstring)."""
    status = table.column("status")
    keep = pc.is_in(status, value_set=pa.array(sorted(statuses - {"errored"}), pa.string()))
    if "errored" in statuses and "error_code" in table.column_names:
        codes = table.column("error_code").to_pylist()
        final_error = pa.array([is_final_error_code(code) for code in codes], pa.bool_())
        keep = pc.or_(keep, pc.and_(pc.equal(status, "errored"), final_error))
    return pc.fill_null(keep, False)


def load_previous(output_dir: str, statuses: Collection[str] = DEFAULT_CARRY_STATUSES) -> pa.Table | None:
    """Return the rows of a previous merged output that hold a final result (key + result columns), or None.

    ``statuses`` says which stored statuses count as final (see :data:`DEFAULT_CARRY_STATUSES`).
    An output written before ``error_code`` existed keeps no ``errored`` row: its errors cannot
    be told apart, so they are sent again.
    """
    chosen = check_carry_statuses(statuses)
    parts = OutputFolder(output_dir).parts()
    if not parts:
        return None
    wanted = ["custom_id", "request_fingerprint", *CARRIED_COLUMNS]
    tables = []
    for part in parts:
        with part.open("rb") as handle:
            pf = pq.ParquetFile(handle)
            names = set(pf.schema_arrow.names)
            lacking = set(wanted) - names - {"error_code"}
            if lacking:
                log.warning("%s lacks %s; it cannot be used for skip_unchanged", part, sorted(lacking))
                continue
            table = pf.read(columns=[name for name in wanted if name in names])
        if "error_code" not in table.column_names:  # written before the column existed
            table = table.append_column("error_code", pa.nulls(table.num_rows, pa.string()))
        tables.append(table.filter(_final(table, chosen)).select(wanted))
    if not tables:
        return None
    previous = pa.concat_tables(tables, promote_options="permissive")
    return previous.append_column("_key", _keys(previous))


def _filter_requests(path: AnyPath, drop: set[str]) -> tuple[bytes, int]:
    """Return the chunk file's lines without the custom_ids in ``drop``, and how many remain."""
    kept: list[bytes] = []
    with path.open("rb") as handle:
        for line in handle:
            if line.strip() and orjson.loads(line)["custom_id"] not in drop:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
    return b"".join(kept), len(kept)


def apply_skip_unchanged(
    descriptors: list[ChunkDescriptor], previous: pa.Table | None, staged: ChunkFiles, published: ChunkFiles
) -> tuple[list[ChunkDescriptor], SkipStats]:
    """Drop unchanged rows' requests from each chunk and write their stored results as carry files.

    The chunk files are read and rewritten in ``staged`` (not yet published); the descriptors
    returned name the carry files in ``published``, where the staging folder will be moved.
    """
    rows_total = sum(d["num_requests"] for d in descriptors)
    if previous is None or previous.num_rows == 0:
        return descriptors, SkipStats(rows=rows_total, carried=0)
    out: list[ChunkDescriptor] = []
    carried_total = 0
    prev_keys = previous.column("_key")
    for d in descriptors:
        index = d["chunk_index"]
        with staged.rows(index).open("rb") as handle:
            rows = pq.read_table(handle, columns=["custom_id", "request_fingerprint"])
        mask = pc.is_in(_keys(rows), value_set=prev_keys)
        carried_ids = rows.filter(mask).column("custom_id").to_pylist()
        if not carried_ids:
            out.append(d)
            continue
        carried = previous.filter(pc.is_in(prev_keys, value_set=_keys(rows.filter(mask))))
        with staged.carry(index).open("wb") as sink:
            pq.write_table(carried.select(["custom_id", *CARRIED_COLUMNS]), sink, compression="zstd")
        payload, remaining = _filter_requests(staged.requests(index), set(carried_ids))
        with staged.requests(index).open("wb") as sink:
            sink.write(payload)
        carried_total += len(carried_ids)
        label = f"chunk {d['chunk_index'] + 1}/{d['num_chunks']} ({remaining:,} req, {len(carried_ids):,} unchanged)"
        out.append(
            {
                **d,
                "num_requests": remaining,
                "num_bytes": len(payload),
                "fingerprint": hashlib.sha256(payload).hexdigest(),
                "label": label,
                "carry_path": str(published.carry(index)),
                "num_carried": len(carried_ids),
            }
        )
    return out, SkipStats(rows=rows_total, carried=carried_total)


def read_carried(carry_path: str) -> pa.Table:
    """Return the carried results of one chunk: a result table plus ``batch_id`` (the batch that answered).

    The columns follow :func:`~airflow_batch_provider.results.table.result_schema`; the HTTP status
    was not stored: 200 for answered rows, null for errored ones.
    """
    with to_path(carry_path).open("rb") as handle:
        table = pq.read_table(handle)
    count = table.num_rows
    columns = {name: table.column(name) for name in ("custom_id", "status", "response", "finish_reason", "error")}
    if "error_code" in table.column_names:
        columns["error_code"] = table.column("error_code")
    else:  # a carry file written before the column existed
        columns["error_code"] = pa.chunked_array([pa.nulls(count, pa.string())])
    answered = pc.not_equal(table.column("status"), "errored")
    columns["http_status"] = pc.if_else(answered, pa.scalar(200, pa.int64()), pa.scalar(None, pa.int64()))
    for name in ("input_tokens", "output_tokens"):
        columns[name] = table.column(name).cast(pa.int64())
    for name in ("cached_input_tokens", "cache_write_tokens"):  # paid for in the run that sent them
        columns[name] = pa.chunked_array([pa.nulls(count, pa.int64())])
    columns["batch_id"] = table.column("batch_id")
    return pa.table(columns)


def carried_summary(stats: SkipStats) -> list[tuple[str, Any]]:
    """Rows for the chunk summary table."""
    return [("unchanged (carried)", f"{stats.carried:,}"), ("to send", f"{stats.sent:,}")]
