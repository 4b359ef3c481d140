"""Cut rendered request lines into chunks and write each chunk's requests and rows files.

The files go into a staging folder (:class:`~airflow_batch_provider.job_folder.ChunkFiles`);
:mod:`airflow_batch_provider.chunking.staging` publishes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from airflow_batch_provider.chunking.column_names import CUSTOM_ID, FINGERPRINT
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.chunking.requests import RenderedRequests
from airflow_batch_provider.exceptions import ChunkLimitError
from airflow_batch_provider.job_folder import ChunkFiles
from airflow_batch_provider.utils.storage import AnyPath


def check_line_sizes(
    sizes: np.ndarray, byte_cap: int, limits: ProviderLimits, offset: int, custom_ids: pa.Array
) -> None:
    if sizes.size and int(sizes.max()) > byte_cap:
        index = int(np.argmax(sizes > byte_cap))
        raise ChunkLimitError(
            f"Row {offset + index} (custom_id {custom_ids[index].as_py()!r}) renders to a request of "
            f"{int(sizes[index]):,} bytes, "
            f"more than the chunk byte cap of {byte_cap:,} bytes. Shorten that row's text, or raise byte_cap "
            f"(at most {limits.max_bytes:,} bytes for {limits.provider}).",
            rows=[offset + index],
        )


def rows_schema(source: pa.Schema) -> pa.Schema:
    fields = [field for field in source if field.name != CUSTOM_ID]
    return pa.schema([*fields, pa.field(CUSTOM_ID, pa.string()), pa.field(FINGERPRINT, pa.string())])


def rows_batch(
    batch: pa.RecordBatch, custom_ids: pa.Array, fingerprints: pa.Array, schema: pa.Schema
) -> pa.RecordBatch:
    arrays = [batch.column(name) for name in schema.names[:-2]]
    arrays += [custom_ids.cast(pa.string()), fingerprints]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass(frozen=True)
class WrittenChunk:
    index: int
    num_requests: int
    num_bytes: int
    fingerprint: str


class ChunkWriter:
    """Cut request lines into numbered chunks at the count or byte limit and write each chunk's files.

    The caller's thread only decides where chunks end. Each finished chunk (its lines, still in
    the batches' Arrow buffers, and its rows) goes to a pool of :data:`_WRITERS` background
    threads that write the JSONL file, hash it and write the parquet rows file: file writes,
    sha256 and parquet encoding release the GIL, so that work runs on other cores while the
    caller renders the next batch. (Profiled at 1M rows, one writer thread was the slowest
    stage: the caller waited for it 1.2 s of 2.9 s.) At most :data:`_PENDING_CHUNKS` chunks are
    queued or being written; a write error is raised by the next call that waits (:meth:`write`
    or :meth:`finish`).
    """

    def __init__(self, files: ChunkFiles, *, chunk_size: int, byte_cap: int) -> None:
        self.files = files
        self.chunk_size = chunk_size
        self.byte_cap = byte_cap
        self._blocks: list[memoryview] = []
        self._rows: list[pa.RecordBatch] = []
        self._count = 0
        self._bytes = 0
        self._files = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="chunk-files")
        self._written: list[tuple[WrittenChunk, Future[str]]] = []  # each chunk and its file's sha256
        self._settled = 0  # chunks before this index are written (their futures were waited for)

    def write(self, lines: RenderedRequests, rows: pa.RecordBatch) -> None:
        """Append ``lines`` (each within the byte cap) and their ``rows``."""
        sizes, ends = lines.sizes, lines.offsets[1:] - lines.offsets[0]  # ends[i]: bytes of lines 0..i
        pos, total = 0, len(lines)
        while pos < total:
            if self._count >= self.chunk_size or (self._count and int(sizes[pos]) > self.byte_cap - self._bytes):
                self._close()
            before = int(ends[pos - 1]) if pos else 0
            fit_by_bytes = int(np.searchsorted(ends, before + self.byte_cap - self._bytes, side="right"))
            end = min(total, pos + self.chunk_size - self._count, fit_by_bytes)
            block = lines.data(pos, end)
            self._blocks.append(block)
            self._rows.append(rows.slice(pos, end - pos))
            self._count += end - pos
            self._bytes += len(block)
            pos = end

    def _close(self) -> None:
        index = len(self._written)
        while self._settled <= index - _PENDING_CHUNKS:  # bounded memory
            self._written[self._settled][1].result()  # ... and a write error surfaces here
            self._settled += 1
        paths = (self.files.requests(index), self.files.rows(index))
        digest = self._files.submit(_write_chunk_files, *paths, self._blocks, self._rows)
        self._written.append((WrittenChunk(index, self._count, self._bytes, ""), digest))
        self._blocks, self._rows, self._count, self._bytes = [], [], 0, 0

    def finish(self) -> list[WrittenChunk]:
        """Close the open chunk, wait until every file is written and return the chunks."""
        if self._count:
            self._close()
        done = [dataclasses.replace(chunk, fingerprint=digest.result()) for chunk, digest in self._written]
        self._files.shutdown()
        return done

    def abort(self) -> None:
        """Stop writing (the caller removes the folder); a file being written is finished first."""
        for _, digest in self._written:
            digest.cancel()
        self._files.shutdown(wait=True)


# Finished chunks that may be queued or being written (each holds at most chunk_size rows), and
# the threads writing them.
_PENDING_CHUNKS = 3
_WRITERS = 2


def _write_chunk_files(
    jsonl_path: AnyPath, rows_path: AnyPath, blocks: list[memoryview], rows: list[pa.RecordBatch]
) -> str:
    """Write one chunk's request lines and rows files; return the sha256 of the requests file."""
    import pyarrow.parquet as pq

    digest = hashlib.sha256()
    with jsonl_path.open("wb") as handle:
        for block in blocks:
            handle.write(block)
            digest.update(block)
    # One table per chunk (bounded by chunk_size rows) so the rows file does not depend on batch_rows.
    table = pa.Table.from_batches(rows)
    with rows_path.open("wb") as handle:
        # A working file, read whole by the merge: no column statistics (nothing filters on them)
        # and no dictionary pages (they cost time; zstd keeps repeated values small anyway).
        pq.write_table(table, handle, compression="zstd", use_dictionary=False, write_statistics=False)
    return digest.hexdigest()
