"""Read a table (parquet, csv or jsonl; a file or a folder; local or object storage) in record batches.

:class:`TableReader` streams a table a bounded number of rows at a time, so memory stays flat
however large the table is; :func:`select_columns` checks the column names a chunk job needs.
Both raise :class:`~airflow_batch_provider.exceptions.InvalidInputError` naming the file at fault.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_batch_provider.chunking.column_names import check_output_names
from airflow_batch_provider.chunking.templates import PromptTemplate
from airflow_batch_provider.chunking.validation import check_csv_quotes
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.utils import storage

# Rows per record batch. The chunk step keeps about three batches in flight (one read and rendered
# ahead, one being hashed, slices of earlier ones in the writers), ~4 KB a row with their rendered
# lines: 8,192 rows held its peak RSS at ~390 MB at 1M rows where 65,536 took ~610 MB, at the same
# speed (docs/performance.md).
DEFAULT_BATCH_ROWS = 8_192

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
# csv/jsonl readers infer column types from the first block: a larger block infers better.
_TEXT_BLOCK_BYTES = 8 * 1024 * 1024


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
    and prompt values keep their exact spelling. Before a csv file is parsed its quotes are
    checked (:func:`~airflow_batch_provider.chunking.validation.check_csv_quotes`, one extra vectorised
    pass over the bytes): the csv reader would otherwise read the rows after an unclosed quote
    into one value, silently.
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
        self._quotes_checked: set[str] = set()

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
            if source_file.fmt == "csv" and source_file.path not in self._quotes_checked:
                self._check_quotes(source_file)
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
            hint = self._hint(source_file, err)
            raise InvalidInputError(
                f"Cannot read {source_file.path} as {source_file.fmt}: {type(err).__name__}: {err}"
                + (f". {hint}" if hint else "")
            ) from err

    def _hint(self, source_file: _SourceFile, err: BaseException) -> str:
        """Return what to do about a read error, for the errors we can tell apart (else "")."""
        text, fmt = str(err), source_file.fmt
        if fmt == "parquet":
            return ""
        if text.startswith(("Empty CSV file", "Empty JSON")):
            what = "a header row and at least one row" if fmt == "csv" else "one JSON object per line"
            return f"The file is empty: write {what}, or leave the file out of the source folder."
        if "CSV parse error: Expected" in text:
            where = _first_ragged_csv_row(self._lines_of(source_file))
            at = f"Line {where[0]} has {where[1]} field(s) where the header has {where[2]}" if where else "A row"
            return f'{at}: quote values that contain the delimiter ("a, b"), or fix that row.'
        if "JSON parse error" in text:
            line = _first_bad_json_line(self._lines_of(source_file))
            at = f"Line {line} is" if line else "A line is"
            return f"{at} not one complete JSON object: each line of a jsonl file must hold exactly one object."
        if "conversion error" in text or "changed from" in text:
            return (
                f"{fmt} column types are inferred from the first block of the file and a later value does not "
                "fit: write the file as parquet (typed columns), or make that column's values consistent."
            )
        if "UTF8" in text or "UTF-8" in text or isinstance(err, UnicodeDecodeError):
            return "The file is not UTF-8: re-encode it (e.g. iconv -f latin1 -t utf-8)."
        return ""

    def _lines_of(self, source_file: _SourceFile) -> Iterator[str]:
        """Yield the file's text lines again (error path only: after a read failed)."""
        with ExitStack() as stack:
            stream = self._input(source_file, stack)
            yield from io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")

    def _check_quotes(self, source_file: _SourceFile) -> None:
        with ExitStack() as stack:
            stream = self._guard(source_file, lambda: self._input(source_file, stack))
            blocks = iter(lambda: self._guard(source_file, lambda: stream.read(_TEXT_BLOCK_BYTES)), b"")
            check_csv_quotes(blocks, source_file.path)
        self._quotes_checked.add(source_file.path)

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


def _first_ragged_csv_row(lines: Iterator[str]) -> tuple[int, int, int] | None:
    """Return (1-based line where it starts, fields, header fields) of the first csv row of the wrong width."""
    import csv

    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        return None
    start = reader.line_num + 1
    for row in reader:
        if row and len(row) != len(header):
            return start, len(row), len(header)
        start = reader.line_num + 1
    return None


def _first_bad_json_line(lines: Iterator[str]) -> int | None:
    """Return the 1-based number of the first non-blank line that is not one JSON object."""
    import json

    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            if not isinstance(json.loads(line), dict):
                return number
        except ValueError:
            return number
    return None


def _parquet_batches(parquet: Any, batch_rows: int, columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
    # One reader per row group: a single iter_batches over the whole file keeps its pre-buffered
    # ranges until the end, so memory would grow with the file (seen: +80 MB per 10M rows).
    selected = None if columns is None else list(columns)
    for group in range(parquet.num_row_groups):
        yield from parquet.iter_batches(batch_size=batch_rows, row_groups=[group], columns=selected)


def select_columns(
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
    check_output_names(names, id_column)
    return names
