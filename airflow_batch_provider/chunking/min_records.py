"""Keep the last chunk of a job at or above the provider's per-batch minimum (Bedrock: 100 records).

Chunks are cut while the table streams, so only the last one can come out short (say 20,030 rows
at ``chunk_size=10_000`` leave a tail of 30). A Bedrock job under its minimum fails validation
hours later, so the chunk step fixes it before anything is published:

- the tail joins the chunk before it when the two fit one batch (count and byte cap): 20,030 rows
  give chunks of 10,000 and 10,030;
- otherwise the two are split evenly (each half then holds at least the minimum, since together
  they exceed the per-batch maximum, which is far above twice the minimum).

A job whose whole table is under the minimum stays one short chunk: there is nothing to merge it
with, and the Bedrock hook sends such small batches through on-demand invocation instead (see
:mod:`airflow_batch_provider.backends.bedrock.hook`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.exceptions import ChunkLimitError
from airflow_batch_provider.utils import storage


def needs_rebalance(counts: Sequence[int], limits: ProviderLimits) -> bool:
    """Return True when the last of several chunks holds fewer requests than the provider accepts."""
    return len(counts) > 1 and counts[-1] < limits.min_requests


def _read_lines(path: storage.AnyPath) -> list[bytes]:
    with path.open("rb") as handle:
        return [line for line in handle if line.strip()]


def _write(jsonl: storage.AnyPath, rows_path: storage.AnyPath, lines: list[bytes], rows: pa.Table) -> str:
    digest = hashlib.sha256()
    with jsonl.open("wb") as handle:
        for line in lines:
            handle.write(line)
            digest.update(line)
    with rows_path.open("wb") as handle:  # same settings as the chunk writer
        pq.write_table(rows, handle, compression="zstd", use_dictionary=False, write_statistics=False)
    return digest.hexdigest()


def rebalance_tail(
    previous: tuple[storage.AnyPath, storage.AnyPath],
    last: tuple[storage.AnyPath, storage.AnyPath],
    limits: ProviderLimits,
    byte_cap: int,
) -> list[tuple[int, int, str]]:
    """Rewrite the last two chunks (``(requests file, rows file)`` each) so none is under the minimum.

    Return ``(requests, bytes, sha256)`` for each chunk that remains: one entry when the tail was
    merged (the last chunk's files are deleted), two when the pair was split evenly.
    """
    lines = _read_lines(previous[0]) + _read_lines(last[0])
    with previous[1].open("rb") as first, last[1].open("rb") as second:
        rows = pa.concat_tables([pq.read_table(first), pq.read_table(second)])
    if rows.num_rows != len(lines):
        raise ChunkLimitError(
            f"Chunk files {previous[0]} and {last[0]} disagree with their rows files; rerun the chunk step."
        )
    total_bytes = sum(len(line) for line in lines)
    if len(lines) <= limits.max_requests and total_bytes <= byte_cap:
        digest = _write(previous[0], previous[1], lines, rows)
        last[0].unlink()
        last[1].unlink()
        return [(len(lines), total_bytes, digest)]
    half = len(lines) // 2
    parts = [(lines[:half], rows.slice(0, half)), (lines[half:], rows.slice(half))]
    out: list[tuple[int, int, str]] = []
    for (jsonl, rows_path), (part_lines, part_rows) in zip((previous, last), parts, strict=True):
        size = sum(len(line) for line in part_lines)
        if size > byte_cap:
            raise ChunkLimitError(
                f"The last chunk is under {limits.provider}'s minimum of {limits.min_requests} requests per batch, "
                f"and split evenly with the chunk before it ({len(lines):,} requests together) one half exceeds "
                f"the byte cap of {byte_cap:,} bytes. Lower chunk_size so that chunks end by count, not by size."
            )
        out.append((len(part_lines), size, _write(jsonl, rows_path, part_lines, part_rows)))
    return out
