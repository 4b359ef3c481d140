"""Turn a table into provider-ready JSONL chunk files, validated before anything is submitted.

The table (parquet, csv or jsonl; one file or a folder of them; local or any ``ObjectStoragePath``
URL) is streamed in record batches, so memory stays flat however many rows it has — except the
duplicate-id check, which keeps 8 bytes per row (see :func:`_report_duplicates`). Each batch is
rendered into request lines and cut into chunks by request count and byte cap.

Everything is written into ``job_dir/.staging-<uuid>/`` and moved to ``job_dir/chunks/`` only when
the whole table validated; on any error the staging folder is removed, so a bad row at position
9,000,000 leaves nothing behind and an earlier good ``chunks/`` folder stays as it was. Layout::

    job_dir/chunks/chunk-00000.jsonl         requests, one per line, "\\n"-terminated
    job_dir/chunks/chunk-00000.rows.parquet  source columns + custom_id + request_fingerprint
    job_dir/chunks/manifest.json             the ChunkDescriptor list

Output is deterministic: the same table and spec give byte-identical files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from airflow_batch_provider import storage
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import ChunkLimitError, InvalidInputError
from airflow_batch_provider.limits import ProviderLimits, limits_for
from airflow_batch_provider.requests import RequestSpec, renderer_for
from airflow_batch_provider.templates import PromptTemplate, RowProblems, to_string_array

CHUNKS_DIR = "chunks"
MANIFEST_NAME = "manifest.json"
CUSTOM_ID = "custom_id"
FINGERPRINT = "request_fingerprint"
DEFAULT_CHUNK_SIZE = 5_000
DEFAULT_BATCH_ROWS = 65_536

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
# csv/jsonl readers infer column types from the first block: a larger block infers better.
_TEXT_BLOCK_BYTES = 8 * 1024 * 1024


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
    selected = _select_columns(reader.schema(), prompt, id_column, columns)

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
        for batch in reader.batches(selected):
            texts = prompt.render_batch(batch, offset=num_rows, problems=problems)
            custom_ids = ids.build(batch, offset=num_rows, problems=problems)
            hashes.append(np.fromiter(map(hash, custom_ids), dtype=np.int64, count=len(custom_ids)))
            lines, fingerprints = renderer.render_many(custom_ids, texts)
            sizes = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines)) + 1
            _check_line_sizes(sizes, byte_cap, limits, num_rows, custom_ids)
            if not problems:  # after the first bad row only validate: the staging folder is discarded
                if rows_schema is None:
                    rows_schema = _rows_schema(batch.schema)
                writer.write(lines, sizes, _rows_batch(batch, custom_ids, fingerprints, rows_schema))
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


# --------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _SourceFile:
    path: str
    fmt: str
    compression: str | None


def _classify(path: str) -> _SourceFile:
    name = path.rsplit("/", 1)[-1].lower()
    compression = None
    for suffix, codec in _COMPRESSIONS.items():
        if name.endswith(suffix):
            name, compression = name[: -len(suffix)], codec
    for suffix, fmt in _FORMATS.items():
        if name.endswith(suffix):
            if fmt == "parquet" and compression:
                break
            return _SourceFile(path, fmt, compression)
    raise InvalidInputError(
        f"Cannot tell the format of {path}; supported: .parquet/.pq, .csv, .jsonl/.ndjson "
        "(csv and jsonl optionally .gz/.bz2/.zst), or a folder of such files."
    )


class TableReader:
    """Stream record batches of at most ``batch_rows`` rows from a table file or a folder of them.

    ``string_columns`` are read as text from csv (no type inference) so ids such as ``00123``
    and prompt values keep their exact spelling.
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        *,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        string_columns: Sequence[str] = (),
    ) -> None:
        self.source = os.fspath(source)
        self.batch_rows = batch_rows
        self.string_columns = list(string_columns)
        self.files = self._resolve()
        self._schema: pa.Schema | None = None

    def _resolve(self) -> list[_SourceFile]:
        path = storage.to_path(self.source)
        try:
            is_dir = path.is_dir()
            exists = is_dir or path.exists()
            if not exists:
                raise InvalidInputError(f"The source table {self.source} does not exist.")
            if not is_dir:
                return [_classify(str(path))]
            found = sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith(("_", ".")))
        except OSError as err:
            raise InvalidInputError(f"Cannot access the source table {self.source}: {err}") from None
        if not found:
            raise InvalidInputError(f"The source folder {self.source} holds no table files.")
        files = [_classify(p) for p in found]
        formats = sorted({f.fmt for f in files})
        if len(formats) > 1:
            raise InvalidInputError(f"The source folder {self.source} mixes formats {formats}; keep one per folder.")
        return files

    def schema(self) -> pa.Schema:
        """Return the first file's schema (all columns)."""
        if self._schema is None:
            with ExitStack() as stack:
                self._schema = self._guard(self.files[0], lambda: self._open(self.files[0], None, stack)[0])
        return self._schema

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Yield non-empty record batches of ``columns`` (all when None) from every file, in order."""
        target: pa.Schema | None = None
        for source_file in self.files:
            with ExitStack() as stack:
                schema, batches = self._guard(source_file, lambda f=source_file: self._open(f, columns, stack))
                if target is None:
                    target = schema
                while True:
                    batch = self._guard(source_file, lambda b=batches: next(b, None))
                    if batch is None:
                        break
                    if columns is not None and batch.schema.names != list(columns):
                        batch = batch.select(list(columns))
                    if not batch.schema.equals(target):
                        batch = self._guard(source_file, lambda b=batch, t=target: b.cast(t))
                    for start in range(0, batch.num_rows, self.batch_rows):
                        yield batch.slice(start, self.batch_rows)

    def _guard(self, source_file: _SourceFile, call: Any) -> Any:
        try:
            return call()
        except (pa.ArrowException, OSError, ValueError, TypeError) as err:
            hint = ""
            if source_file.fmt != "parquet":
                hint = f" ({source_file.fmt} column types are inferred from the first block; parquet avoids this.)"
            raise InvalidInputError(
                f"Cannot read {source_file.path} as {source_file.fmt}: {type(err).__name__}: {err}{hint}"
            ) from err

    def _input(self, source_file: _SourceFile, stack: ExitStack) -> Any:
        path = storage.to_path(source_file.path)
        handle: Any = str(path) if isinstance(path, Path) else stack.enter_context(path.open("rb"))
        if source_file.fmt == "parquet":
            return handle
        return stack.enter_context(pa.input_stream(handle, compression=source_file.compression))

    def _open(
        self, source_file: _SourceFile, columns: Sequence[str] | None, stack: ExitStack
    ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        handle = self._input(source_file, stack)
        if source_file.fmt == "parquet":
            import pyarrow.parquet as pq

            parquet = stack.enter_context(pq.ParquetFile(handle))
            schema = parquet.schema_arrow
            batches = _parquet_batches(parquet, self.batch_rows, columns)
        elif source_file.fmt == "csv":
            import pyarrow.csv as pacsv

            convert = pacsv.ConvertOptions(
                column_types={name: pa.string() for name in self.string_columns},
                include_columns=None if columns is None else list(columns),
            )
            reader = pacsv.open_csv(
                handle,
                read_options=pacsv.ReadOptions(block_size=_TEXT_BLOCK_BYTES),
                # Prompt text is often multi-line: allow newlines inside quoted values.
                parse_options=pacsv.ParseOptions(newlines_in_values=True),
                convert_options=convert,
            )
            schema, batches = reader.schema, iter(reader)
        else:
            import pyarrow.json as pajson

            reader = pajson.open_json(handle, read_options=pajson.ReadOptions(block_size=_TEXT_BLOCK_BYTES))
            schema, batches = reader.schema, iter(reader)
        if columns is not None:
            schema = pa.schema([schema.field(name) for name in columns])
        return schema.remove_metadata(), batches


def _parquet_batches(parquet: Any, batch_rows: int, columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
    # One reader per row group: a single iter_batches over the whole file keeps its pre-buffered
    # ranges until the end, so memory would grow with the file (seen: +80 MB per 10M rows).
    selected = None if columns is None else list(columns)
    for group in range(parquet.num_row_groups):
        yield from parquet.iter_batches(batch_size=batch_rows, row_groups=[group], columns=selected)


def _select_columns(
    schema: pa.Schema, prompt: PromptTemplate, id_column: str | None, columns: Sequence[str] | None
) -> list[str]:
    """Return the source columns to read and keep, in table order, after checking every name."""
    names = list(schema.names)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidInputError(f"The table has repeated column names {repeated}; rename them.")
    prompt.check_columns(names)
    if id_column is not None and id_column not in names:
        raise InvalidInputError(f"id_column {id_column!r} is not a column of the table; available columns: {names}.")
    if columns is not None:
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise InvalidInputError(f"columns {unknown} are not in the table; available columns: {names}.")
        wanted = {*columns, *prompt.fields, *([id_column] if id_column else [])}
        names = [n for n in names if n in wanted]
    if FINGERPRINT in names:
        raise InvalidInputError(f"The table has a column named {FINGERPRINT!r}, which the rows file adds; rename it.")
    if CUSTOM_ID in names and id_column != CUSTOM_ID:
        raise InvalidInputError(
            f"The table has a column named {CUSTOM_ID!r} that is not the id_column; pass id_column={CUSTOM_ID!r}, "
            "rename it, or leave it out with columns=."
        )
    return names


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

    def build(self, batch: pa.RecordBatch, *, offset: int, problems: RowProblems) -> list[str]:
        """Return one custom_id per row; bad rows get a unique placeholder and are recorded."""
        if self.id_column is None:
            return self._hash_ids(batch)
        name = self.id_column
        user = self.user_ids(batch)
        bad = pc.fill_null(pc.or_kleene(pc.is_null(user), pc.equal(pc.binary_length(user), 0)), False)
        bad_rows = np.asarray(pc.indices_nonzero(bad))
        problems.add(
            f"null or empty id in column {name!r}",
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
        values: list[Any] = user.to_pylist()
        if self._regex is not None:
            fits = pc.fill_null(pc.match_substring_regex(user, self._regex), True)
            misfits = np.asarray(pc.indices_nonzero(pc.invert(fits)))
            for index in misfits.tolist():
                values[index] = derive_custom_id(values[index])
            self.derived += int(misfits.size)
            if misfits.size and name == CUSTOM_ID:
                problems.add(
                    f"id in column {CUSTOM_ID!r} that {self.limits.provider} does not accept",
                    misfits + offset,
                    advice=f"These ids must be rewritten, which would overwrite the column {CUSTOM_ID!r} in the "
                    "rows file; rename the column and pass the new name as id_column.",
                )
        for index in bad_rows.tolist():
            values[index] = f"\x00{offset + index}"  # unique placeholder: keeps these rows out of the duplicate check
        return values

    def _hash_ids(self, batch: pa.RecordBatch) -> list[str]:
        # Hash the values' text forms so the same data read from csv, jsonl or parquet gets the same ids.
        columns = [to_string_array(batch.column(name)).to_pylist() for name in self.hash_columns]
        dumps, blake2b = orjson.dumps, hashlib.blake2b
        return ["row-" + blake2b(dumps(values), digest_size=8).hexdigest() for values in zip(*columns)]


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
        custom_ids = ids.build(batch, offset=offset, problems=RowProblems())
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
    sizes: np.ndarray, byte_cap: int, limits: ProviderLimits, offset: int, custom_ids: Sequence[str]
) -> None:
    if sizes.size and int(sizes.max()) > byte_cap:
        index = int(np.argmax(sizes > byte_cap))
        raise ChunkLimitError(
            f"Row {offset + index} (custom_id {custom_ids[index]!r}) renders to a request of "
            f"{int(sizes[index]):,} bytes, "
            f"more than the chunk byte cap of {byte_cap:,} bytes. Shorten that row's text, or raise byte_cap "
            f"(at most {limits.max_bytes:,} bytes for {limits.provider}).",
            rows=[offset + index],
        )


def _rows_schema(source: pa.Schema) -> pa.Schema:
    fields = [field for field in source if field.name != CUSTOM_ID]
    return pa.schema([*fields, pa.field(CUSTOM_ID, pa.string()), pa.field(FINGERPRINT, pa.string())])


def _rows_batch(
    batch: pa.RecordBatch, custom_ids: list[str], fingerprints: list[str], schema: pa.Schema
) -> pa.RecordBatch:
    arrays = [batch.column(name) for name in schema.names[:-2]]
    arrays += [pa.array(custom_ids, pa.string()), pa.array(fingerprints, pa.string())]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass(frozen=True)
class _WrittenChunk:
    index: int
    num_requests: int
    num_bytes: int
    fingerprint: str


class _ChunkWriter:
    """Append request lines to numbered chunk files, closing a chunk at the count or byte limit."""

    def __init__(self, folder: storage.AnyPath, *, chunk_size: int, byte_cap: int) -> None:
        self.folder = folder
        self.chunk_size = chunk_size
        self.byte_cap = byte_cap
        self.done: list[_WrittenChunk] = []
        self._handle: IO[bytes] | None = None
        self._digest = hashlib.sha256()
        self._rows: list[pa.RecordBatch] = []
        self._count = 0
        self._bytes = 0

    def write(self, lines: list[bytes], sizes: np.ndarray, rows: pa.RecordBatch) -> None:
        """Append ``lines`` (``sizes`` = length + 1 each, all within the byte cap) and their ``rows``."""
        ends = np.cumsum(sizes)  # ends[i]: bytes of lines[0..i] with their newlines
        pos, total = 0, len(lines)
        while pos < total:
            if self._count >= self.chunk_size or (self._count and int(sizes[pos]) > self.byte_cap - self._bytes):
                self._close()
            before = int(ends[pos - 1]) if pos else 0
            fit_by_bytes = int(np.searchsorted(ends, before + self.byte_cap - self._bytes, side="right"))
            end = min(total, pos + self.chunk_size - self._count, fit_by_bytes)
            self._append(lines[pos:end], rows.slice(pos, end - pos), int(ends[end - 1]) - before)
            pos = end

    def _append(self, lines: list[bytes], rows: pa.RecordBatch, num_bytes: int) -> None:
        if self._handle is None:
            self._handle = self._path("jsonl").open("wb")
            self._digest = hashlib.sha256()
        data = b"\n".join(lines) + b"\n"
        self._handle.write(data)
        self._digest.update(data)
        self._rows.append(rows)
        self._count += len(lines)
        self._bytes += num_bytes

    def _path(self, kind: str) -> storage.AnyPath:
        suffix = "jsonl" if kind == "jsonl" else "rows.parquet"
        return self.folder / f"chunk-{len(self.done):05d}.{suffix}"

    def _close(self) -> None:
        import pyarrow.parquet as pq

        assert self._handle is not None
        self._handle.close()
        self._handle = None
        # One table per chunk (bounded by chunk_size rows) so the rows file does not depend on batch_rows.
        rows_path = self._path("rows")
        table = pa.Table.from_batches(self._rows)
        with rows_path.open("wb") as handle:
            # custom_id and request_fingerprint are unique per row: dictionary-encoding them only costs time.
            pq.write_table(table, handle, compression="zstd", use_dictionary=table.schema.names[:-2])
        self.done.append(_WrittenChunk(len(self.done), self._count, self._bytes, self._digest.hexdigest()))
        self._rows, self._count, self._bytes = [], 0, 0

    def finish(self) -> list[_WrittenChunk]:
        """Close the open chunk and return every chunk written."""
        if self._count:
            self._close()
        return self.done

    def abort(self) -> None:
        """Close an open file without finishing it (the caller removes the folder)."""
        if self._handle is not None:
            try:
                self._handle.close()
            finally:
                self._handle = None


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
