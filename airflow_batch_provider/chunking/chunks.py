"""Turn a table into provider-ready JSONL chunk files, validated before anything is submitted.

The table (parquet, csv or jsonl; one file or a folder of them; local or any ``ObjectStoragePath``
URL; see :mod:`airflow_batch_provider.chunking.tables`) is streamed in record batches, so memory stays flat
however many rows it has — except the duplicate-id check, which keeps 8 bytes per row (see
:func:`_report_duplicates`). Each batch is rendered into request lines and cut into chunks by
request count and byte cap.

Speed: a batch's request lines are built by Arrow kernels into one buffer (prompts and ids are
JSON-escaped exactly as orjson does it), so the only per-row Python left is the sha256 of each
request fingerprint; the parquet rows files are written by a background thread. ``make bench``
measures it against a plain pyarrow + orjson loop (``docs/performance.md``).

Everything is written into ``job_dir/.staging-<uuid>/`` and moved to ``job_dir/chunks/`` only when
the whole table validated; on any error the staging folder is removed, so a bad row at position
9,000,000 leaves nothing behind and an earlier good ``chunks/`` folder stays as it was. Layout::

    job_dir/chunks/chunk-00000.jsonl         requests, one per line, "\\n"-terminated
    job_dir/chunks/chunk-00000.rows.parquet  source columns + custom_id + request_fingerprint
    job_dir/chunks/manifest.json             the ChunkDescriptor list

Output is deterministic: the same table and spec give byte-identical files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from airflow_batch_provider.chunking.limits import ProviderLimits, limits_for
from airflow_batch_provider.chunking.requests import RenderedRequests, RequestSpec, renderer_for
from airflow_batch_provider.chunking.tables import (  # TableReader and these names used to live here: still importable
    CUSTOM_ID,
    DEFAULT_BATCH_ROWS,
    FINGERPRINT,
    TableReader,
    select_columns,
)
from airflow_batch_provider.chunking.templates import PromptTemplate, RowProblems, to_string_array
from airflow_batch_provider.chunking.validation import check_utf8
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import ChunkLimitError, InvalidInputError
from airflow_batch_provider.utils import storage
from airflow_batch_provider.utils.background import run_ahead

CHUNKS_DIR = "chunks"
MANIFEST_NAME = "manifest.json"
DEFAULT_CHUNK_SIZE = 5_000


@dataclass(frozen=True)
class ChunkResult:
    """What :func:`build_chunks` wrote, plus totals for logging."""

    descriptors: list[ChunkDescriptor]
    num_rows: int
    num_bytes: int
    derived_ids: int  # Anthropic ids rewritten to "h-<sha256>" because the user's id did not fit
    seconds: float


def check_chunk_size(chunk_size: int, provider: str) -> int:
    """Return ``chunk_size`` or raise InvalidInputError unless it is 1 … the provider's max requests."""
    limits = limits_for(provider)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or not 1 <= chunk_size <= limits.max_requests:
        raise InvalidInputError(
            f"chunk_size must be an integer from 1 to {limits.max_requests:,} for {provider}, got {chunk_size!r}."
        )
    return chunk_size


def check_byte_cap(byte_cap: int | None, provider: str) -> int:
    """Return ``byte_cap`` (the provider's default when None) or raise unless 1 … the provider's max bytes."""
    limits = limits_for(provider)
    if byte_cap is None:
        return limits.default_byte_cap
    if not isinstance(byte_cap, int) or isinstance(byte_cap, bool) or not 1 <= byte_cap <= limits.max_bytes:
        raise InvalidInputError(
            f"byte_cap must be an integer from 1 to {limits.max_bytes:,} bytes for {provider}, got {byte_cap!r}."
        )
    return byte_cap


def check_map_length(num_chunks: int, *, num_rows: int, chunk_size: int, provider: str) -> None:
    """Raise ChunkLimitError when Airflow cannot map a task over ``num_chunks`` chunks.

    Airflow refuses to expand a mapped task over more than ``[core] max_map_length`` items
    (1,024 by default), so a 10M-row job in chunks of 10,000 would only fail at the submit step.
    The limit is read from this process's Airflow configuration; the scheduler and API server
    must allow the same.
    """
    from airflow.configuration import conf

    limit = conf.getint("core", "max_map_length", fallback=1024)
    if num_chunks <= limit:
        return
    needed = -(-num_rows // limit)  # the chunk_size that would give at most ``limit`` chunks
    largest = limits_for(provider).max_requests
    bigger = f"increase chunk_size to at least {needed:,} (at most {largest:,} for {provider})"
    raise ChunkLimitError(
        f"The table gives {num_chunks:,} chunks of up to {chunk_size:,} requests, but Airflow maps a task over at "
        f"most [core] max_map_length = {limit:,} items, so the mapped submit step could not expand. Raise "
        f"AIRFLOW__CORE__MAX_MAP_LENGTH to at least {num_chunks:,} (for the scheduler and API server as well as the "
        f"workers){f', or {bigger}' if needed <= largest else ''}; see docs/performance.md."
    )


def write_chunks(
    source: str | os.PathLike[str],
    job_dir: str | os.PathLike[str],
    spec: RequestSpec,
    template: str | PromptTemplate,
    *,
    id_column: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    byte_cap: int | None = None,
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> list[ChunkDescriptor]:
    """Write ``source`` as chunk files under ``job_dir/chunks`` and return their descriptors.

    See :func:`build_chunks` for the arguments.
    """
    return build_chunks(
        source,
        job_dir,
        spec,
        template,
        id_column=id_column,
        chunk_size=chunk_size,
        byte_cap=byte_cap,
        columns=columns,
        batch_rows=batch_rows,
    ).descriptors


def build_chunks(
    source: str | os.PathLike[str],
    job_dir: str | os.PathLike[str],
    spec: RequestSpec,
    template: str | PromptTemplate,
    *,
    id_column: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    byte_cap: int | None = None,
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> ChunkResult:
    """Validate ``source`` and write it as chunk files under ``job_dir/chunks``; return descriptors and totals.

    ``template`` is a ``str.format`` prompt over the table's columns. ``id_column`` gives each
    request's custom_id (values cast to text); without it the id is ``row-`` plus 16 hex chars of
    a hash of the row's values, so identical rows are reported as duplicates. A chunk closes at
    ``chunk_size`` requests or before a line would take it past ``byte_cap`` bytes (default: the
    provider's safe cap). ``columns`` limits the source columns read and kept in the rows files
    (template and id columns are always kept). Raises InvalidInputError (ChunkLimitError for size
    limits) naming the rows and columns at fault; nothing is left in ``job_dir`` then.
    """
    started = time.monotonic()
    limits = spec.limits
    chunk_size = check_chunk_size(chunk_size, spec.provider)
    byte_cap = check_byte_cap(byte_cap, spec.provider)
    if not isinstance(batch_rows, int) or batch_rows < 1:
        raise InvalidInputError(f"batch_rows must be a positive integer, got {batch_rows!r}.")
    prompt = template if isinstance(template, PromptTemplate) else PromptTemplate(template)
    renderer = renderer_for(spec)
    text_columns = [*prompt.fields, *([id_column] if id_column else [])]
    reader = TableReader(source, batch_rows=batch_rows, string_columns=text_columns)
    selected = select_columns(reader.schema(), prompt, id_column, columns)

    job = storage.to_path(job_dir)
    created_job_dir = not job.exists()
    if not created_job_dir:
        _remove_leftovers(job)
    staging = job / f".staging-{uuid.uuid4().hex}"
    writer = _ChunkWriter(staging, chunk_size=chunk_size, byte_cap=byte_cap)
    try:
        staging.mkdir(parents=True, exist_ok=True)
        problems = RowProblems()
        ids = _IdBuilder(limits, id_column, selected)
        hashes: list[np.ndarray] = []
        rows_schema: pa.Schema | None = None
        num_rows = 0

        def prepared() -> Iterator[tuple[pa.RecordBatch, pa.Array, pa.Array, pa.Array]]:
            """Read, validate and render each batch (in a background thread: see below)."""
            offset = 0
            for batch in reader.batches(selected):
                check_utf8(batch, offset=offset, problems=problems, what=f"The table {reader.source}")
                # Each row's request body after its custom_id (the prompt as JSON + the rest), in one pass.
                bodies = prompt.render_json(batch, offset=offset, problems=problems, suffix=renderer.body_suffix)
                custom_ids = ids.build(batch, offset=offset, problems=problems)
                hashes.append(_id_hashes(custom_ids))
                lines = renderer.lines_of(custom_ids, bodies)
                yield batch, custom_ids, lines, bodies
                offset += batch.num_rows

        # Two stages overlap: the next batch is read and rendered by Arrow kernels (GIL released)
        # while this thread hashes the fingerprints (GIL held); a third thread writes the files.
        for batch, custom_ids, lines, bodies in run_ahead(prepared(), depth=1, name="chunk-render"):
            rendered = RenderedRequests(lines, renderer.fingerprints(bodies))
            _check_line_sizes(rendered.sizes, byte_cap, limits, num_rows, custom_ids)
            if not problems:  # after the first bad row only validate: the staging folder is discarded
                if rows_schema is None:
                    rows_schema = _rows_schema(batch.schema)
                writer.write(rendered, _rows_batch(batch, custom_ids, rendered.fingerprints, rows_schema))
            num_rows += batch.num_rows
        if num_rows == 0:
            raise InvalidInputError(f"The table {reader.source} has no rows; there is nothing to submit.")
        _report_duplicates(hashes, reader, selected, limits, id_column, problems)
        problems.raise_if_any(f"The table {reader.source}")
        chunks = writer.finish()

        descriptors = _descriptors(job, spec, chunks)
        with (staging / MANIFEST_NAME).open("wb") as handle:
            handle.write(orjson.dumps(descriptors, option=orjson.OPT_INDENT_2) + b"\n")
        _publish(staging, job / CHUNKS_DIR)
    except BaseException:
        writer.abort()
        _remove_tree(staging)
        if created_job_dir and isinstance(job, Path):
            try:
                job.rmdir()  # only succeeds when empty: never removes anything of someone else's
            except OSError:
                pass
        raise
    return ChunkResult(
        descriptors=descriptors,
        num_rows=num_rows,
        num_bytes=sum(d["num_bytes"] for d in descriptors),
        derived_ids=ids.derived,
        seconds=time.monotonic() - started,
    )


# ------------------------------------------------------------------------------------------- ids


def derive_custom_id(user_id: str) -> str:
    """Return the stable Anthropic-compliant id used for a user id that does not fit ``[a-zA-Z0-9_-]{1,64}``."""
    return "h-" + hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:40]


class _IdBuilder:
    """Compute each row's custom_id and record null, empty or over-long ids."""

    def __init__(self, limits: ProviderLimits, id_column: str | None, hash_columns: Sequence[str]) -> None:
        self.limits = limits
        self.id_column = id_column
        self.hash_columns = list(hash_columns)
        self.derived = 0
        pattern = limits.custom_id_pattern
        self._regex = None if pattern is None else f"^(?:{pattern.pattern})$"

    def user_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """Return the id column as text (only with an id_column)."""
        assert self.id_column is not None
        return to_string_array(batch.column(self.id_column))

    def build(self, batch: pa.RecordBatch, *, offset: int, problems: RowProblems) -> pa.Array:
        """Return one custom_id per row (a string array); bad rows get a unique placeholder and are recorded."""
        if self.id_column is None:
            return pa.array(self._hash_ids(batch), pa.string())
        name = self.id_column
        user = self.user_ids(batch)
        bad = pc.fill_null(pc.or_kleene(pc.is_null(user), pc.equal(pc.binary_length(user), 0)), False)
        raw = batch.column(name)
        if pa.types.is_floating(raw.type):  # NaN is a missing value too; as text it would be the id "nan"
            bad = pc.or_(bad, pc.fill_null(pc.is_nan(raw), False))
        bad_rows = np.asarray(pc.indices_nonzero(bad))
        problems.add(
            f"null, NaN or empty id in column {name!r}",
            bad_rows + offset,
            advice="Every row needs an id: fill or filter those rows, or leave id_column unset to hash the rows.",
        )
        limit = self.limits.max_custom_id_chars
        if limit is not None:
            too_long = pc.fill_null(pc.greater(pc.utf8_length(user), limit), False)
            problems.add(
                f"id longer than {limit} characters in column {name!r}",
                np.asarray(pc.indices_nonzero(too_long)) + offset,
                advice=f"{self.limits.provider} accepts custom ids of at most {limit} characters; shorten them.",
            )
        ids = user
        if self._regex is not None:
            misfit = pc.invert(pc.fill_null(pc.match_substring_regex(user, self._regex), True))
            misfits = np.asarray(pc.indices_nonzero(misfit))
            if misfits.size:
                derived = [derive_custom_id(value) for value in user.take(misfits).to_pylist()]
                ids = pc.replace_with_mask(ids, misfit, pa.array(derived, pa.string()))
            self.derived += int(misfits.size)
            if misfits.size and name == CUSTOM_ID:
                problems.add(
                    f"id in column {CUSTOM_ID!r} that {self.limits.provider} does not accept",
                    misfits + offset,
                    advice=f"These ids must be rewritten, which would overwrite the column {CUSTOM_ID!r} in the "
                    "rows file; rename the column and pass the new name as id_column.",
                )
        if bad_rows.size:  # unique placeholders keep these rows out of the duplicate check
            placeholders = [f"\x00{offset + index}" for index in bad_rows.tolist()]
            ids = pc.replace_with_mask(ids, bad, pa.array(placeholders, pa.string()))
        return ids

    def _hash_ids(self, batch: pa.RecordBatch) -> list[str]:
        # Hash the values' text forms so the same data read from csv, jsonl or parquet gets the same ids.
        columns = [to_string_array(batch.column(name)).to_pylist() for name in self.hash_columns]
        dumps, blake2b = orjson.dumps, hashlib.blake2b
        return ["row-" + blake2b(dumps(values), digest_size=8).hexdigest() for values in zip(*columns)]


def _id_hashes(custom_ids: pa.Array) -> np.ndarray:
    """Return Python's 64-bit ``hash()`` of every id (see :func:`_report_duplicates`)."""
    return np.fromiter(map(hash, custom_ids.to_pylist()), dtype=np.int64, count=len(custom_ids))


def _report_duplicates(
    hashes: list[np.ndarray],
    reader: TableReader,
    columns: Sequence[str],
    limits: ProviderLimits,
    id_column: str | None,
    problems: RowProblems,
) -> None:
    """Record rows whose custom_id repeats an earlier row's, naming both positions.

    Memory: instead of a set of every id string (~100 bytes a row, 1 GB at 10M rows) the stream
    keeps one 64-bit ``hash()`` per row (80 MB at 10M; salted per process, so only compared within
    this run). Only when two hashes are equal does a second pass re-read the table to confirm real
    duplicates and find the first positions. At 100M+ rows even 8 bytes a row is too much: write
    per-chunk sorted hash runs to disk and merge them (an external sort), or push the check to a
    query engine such as DuckDB.
    """
    candidates = _duplicate_hashes(hashes)
    if not candidates:
        return
    ids = _IdBuilder(limits, id_column, columns)
    first_seen: dict[str, tuple[int, str | None]] = {}
    later: list[int] = []
    details: list[str] = []
    offset = 0
    for batch in reader.batches(columns):
        custom_ids = ids.build(batch, offset=offset, problems=RowProblems()).to_pylist()
        user = ids.user_ids(batch).to_pylist() if id_column else [None] * batch.num_rows
        for index, custom_id in enumerate(custom_ids):
            if hash(custom_id) not in candidates:
                continue
            position = offset + index
            if custom_id not in first_seen:
                first_seen[custom_id] = (position, user[index])
                continue
            first, first_user = first_seen[custom_id]
            later.append(position)
            if id_column is None:
                details.append(f"rows {first} and {position} are identical (custom_id {custom_id!r})")
            elif first_user == user[index]:
                details.append(f"id {first_user!r} at rows {first} and {position}")
            else:
                details.append(
                    f"ids {first_user!r} (row {first}) and {user[index]!r} (row {position}) "
                    f"both become custom_id {custom_id!r}"
                )
        offset += batch.num_rows
    if id_column is None:
        kind, advice = (
            "duplicate row",
            "Without id_column a row's id is a hash of its values: pass id_column, or drop the repeated rows.",
        )
    else:
        kind, advice = (
            f"duplicate id in column {id_column!r}",
            "Each request needs a unique custom_id: de-duplicate the table or choose another id_column.",
        )
    problems.add(kind, later, advice=advice, details=details)


def _duplicate_hashes(hashes: list[np.ndarray]) -> set[int]:
    """Return the hash values that occur more than once (empties ``hashes`` to halve the peak memory)."""
    if not hashes:
        return set()
    ordered = np.concatenate(hashes)
    hashes.clear()
    ordered.sort()
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    return set(np.unique(repeated).tolist())


# --------------------------------------------------------------------------------------- writing


def _check_line_sizes(
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


def _rows_schema(source: pa.Schema) -> pa.Schema:
    fields = [field for field in source if field.name != CUSTOM_ID]
    return pa.schema([*fields, pa.field(CUSTOM_ID, pa.string()), pa.field(FINGERPRINT, pa.string())])


def _rows_batch(
    batch: pa.RecordBatch, custom_ids: pa.Array, fingerprints: pa.Array, schema: pa.Schema
) -> pa.RecordBatch:
    arrays = [batch.column(name) for name in schema.names[:-2]]
    arrays += [custom_ids.cast(pa.string()), fingerprints]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass(frozen=True)
class _WrittenChunk:
    index: int
    num_requests: int
    num_bytes: int
    fingerprint: str


class _ChunkWriter:
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

    def __init__(self, folder: storage.AnyPath, *, chunk_size: int, byte_cap: int) -> None:
        self.folder = folder
        self.chunk_size = chunk_size
        self.byte_cap = byte_cap
        self._blocks: list[memoryview] = []
        self._rows: list[pa.RecordBatch] = []
        self._count = 0
        self._bytes = 0
        self._files = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="chunk-files")
        self._written: list[tuple[_WrittenChunk, Future[str]]] = []  # each chunk and its file's sha256
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
        paths = (self.folder / f"chunk-{index:05d}.jsonl", self.folder / f"chunk-{index:05d}.rows.parquet")
        digest = self._files.submit(_write_chunk_files, *paths, self._blocks, self._rows)
        self._written.append((_WrittenChunk(index, self._count, self._bytes, ""), digest))
        self._blocks, self._rows, self._count, self._bytes = [], [], 0, 0

    def finish(self) -> list[_WrittenChunk]:
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
    jsonl_path: storage.AnyPath, rows_path: storage.AnyPath, blocks: list[memoryview], rows: list[pa.RecordBatch]
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


def _descriptors(job: storage.AnyPath, spec: RequestSpec, chunks: list[_WrittenChunk]) -> list[ChunkDescriptor]:
    final = job / CHUNKS_DIR
    total = len(chunks)
    return [
        ChunkDescriptor(
            job_dir=str(job),
            chunk_index=chunk.index,
            num_chunks=total,
            provider=spec.provider,
            endpoint=spec.endpoint or "",
            model=spec.model,
            requests_path=str(final / f"chunk-{chunk.index:05d}.jsonl"),
            rows_path=str(final / f"chunk-{chunk.index:05d}.rows.parquet"),
            num_requests=chunk.num_requests,
            num_bytes=chunk.num_bytes,
            fingerprint=chunk.fingerprint,
            label=f"chunk {chunk.index + 1}/{total} ({chunk.num_requests:,} req)",
        )
        for chunk in chunks
    ]


def _publish(staging: storage.AnyPath, final: storage.AnyPath) -> None:
    """Move the staging folder to ``final``, replacing an older one (never merging with it)."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex}")
        _move(final, old)
    _move(staging, final)
    if old is not None:
        _remove_tree(old)


def _remove_leftovers(job: storage.AnyPath) -> None:
    """Remove staging and replaced folders that a killed earlier attempt left in ``job``.

    A job_dir belongs to one task, so any such folder is garbage (possibly gigabytes of it).
    """
    for child in job.iterdir():
        if child.name.startswith((".staging-", f".old-{CHUNKS_DIR}-")):
            _remove_tree(child)


def _move(src: storage.AnyPath, dst: storage.AnyPath) -> None:
    if isinstance(src, Path):
        os.replace(src, str(dst))
    else:
        # Object stores have no folder rename: fsspec copies then deletes each object.
        src.fs.mv(src.path, dst.path, recursive=True)  # type: ignore[union-attr]


def _remove_tree(path: storage.AnyPath) -> None:
    """Delete a folder and everything under it; a missing folder is fine."""
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.fs.rm(path.path, recursive=True)
