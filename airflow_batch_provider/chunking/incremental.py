"""Incremental reprocessing: send only the rows whose request changed since the last stored result.

Every row carries a ``request_fingerprint`` (provider, endpoint and the rendered request without
its custom_id). With ``skip_unchanged=True`` the chunk step compares each row with the previous
merged output: a row whose custom_id already has a ``succeeded`` result for the same fingerprint
is *carried*: its stored result is copied to the chunk's carry file and its request is dropped
from the chunk's requests file, both in the chunk step's staging folder, before the manifest is
written and the folder published (:mod:`airflow_batch_provider.chunking.staging`). The merge
step puts carried results back, so the output still has one row per input row. A prompt change
alters every fingerprint, so every row is sent again; new rows have no stored result, so only
they are sent.

The previous output is read before the merge overwrites it, so a crash in between loses nothing:
the carry files hold the copies. Memory: the previous output's key columns plus the carried
results of one chunk at a time.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.job_folder import ChunkFiles, OutputFolder
from airflow_batch_provider.utils.storage import AnyPath, to_path

log = logging.getLogger(__name__)

CARRIED_COLUMNS = ("status", "response", "finish_reason", "error", "input_tokens", "output_tokens", "batch_id")


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


def load_previous(output_dir: str) -> pa.Table | None:
    """Return the succeeded rows of a previous merged output (key + result columns), or None."""
    parts = OutputFolder(output_dir).parts()
    if not parts:
        return None
    wanted = ["custom_id", "request_fingerprint", *CARRIED_COLUMNS]
    tables = []
    for part in parts:
        with part.open("rb") as handle:
            pf = pq.ParquetFile(handle)
            names = set(pf.schema_arrow.names)
            if not set(wanted) <= names:
                log.warning("%s lacks %s; it cannot be used for skip_unchanged", part, sorted(set(wanted) - names))
                continue
            table = pf.read(columns=wanted)
        tables.append(table.filter(pc.equal(table.column("status"), "succeeded")))
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

    Carried rows succeeded before (HTTP 200); the columns follow
    :func:`~airflow_batch_provider.results.table.result_schema`.
    """
    with to_path(carry_path).open("rb") as handle:
        table = pq.read_table(handle)
    count = table.num_rows
    columns = {name: table.column(name) for name in ("custom_id", "status", "response", "finish_reason", "error")}
    columns["error_code"] = pa.chunked_array([pa.nulls(count, pa.string())])
    columns["http_status"] = pa.chunked_array([pa.repeat(pa.scalar(200, pa.int64()), count)])
    for name in ("input_tokens", "output_tokens"):
        columns[name] = table.column(name).cast(pa.int64())
    columns["batch_id"] = table.column("batch_id")
    return pa.table(columns)


def carried_summary(stats: SkipStats) -> list[tuple[str, Any]]:
    """Rows for the chunk summary table."""
    return [("unchanged (carried)", f"{stats.carried:,}"), ("to send", f"{stats.sent:,}")]
