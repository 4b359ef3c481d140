"""Turn a table into provider-ready JSONL chunk files, validated before anything is submitted.

The table (parquet, csv or jsonl; one file or a folder of them; local or any ``ObjectStoragePath``
URL; see :mod:`airflow_batch_provider.chunking.tables`) is streamed in record batches, so memory stays flat
however many rows it has; the duplicate-id check keeps 8 bytes per row, spilled to local
temporary files past 2M rows (:mod:`airflow_batch_provider.chunking.id_hashes`). Each batch is rendered into request
lines and cut into chunks by request count and byte cap (:mod:`airflow_batch_provider.chunking.writer`).

Speed: a batch's request lines are built by Arrow kernels into one buffer (prompts and ids are
JSON-escaped exactly as orjson does it), so the only per-row Python left is the sha256 of each
request fingerprint; the parquet rows files are written by background threads. ``make bench``
measures it against a plain pyarrow + orjson loop (``docs/performance.md``).

Everything is written into a staging folder — the chunk files, the structured-output schema, the
carried rows of ``skip_unchanged``, then the manifest with the final descriptors — and moved to
``job_dir/chunks/`` only when the whole table validated (:mod:`airflow_batch_provider.chunking.staging`;
the names are in :mod:`airflow_batch_provider.job_folder`). On any error the staging folder is
removed, so a bad row at position 9,000,000 leaves nothing behind and an earlier good ``chunks/``
folder stays as it was.

Output is deterministic: the same table and spec give byte-identical files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from airflow_batch_provider.backends.registry import get_backend
from airflow_batch_provider.chunking.context import ContextCheck
from airflow_batch_provider.chunking.id_hashes import IdHashes
from airflow_batch_provider.chunking.ids import IdBuilder, id_hashes, report_duplicates
from airflow_batch_provider.chunking.incremental import (
    DEFAULT_CARRY_STATUSES,
    SkipStats,
    apply_skip_unchanged,
    load_previous,
)
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.chunking.min_records import needs_rebalance, rebalance_tail
from airflow_batch_provider.chunking.problems import RowProblems
from airflow_batch_provider.chunking.requests import RenderedRequests, RequestRenderer
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.chunking.staging import (
    chunk_descriptors,
    publish,
    remove_leftovers,
    with_schema,
    write_manifest,
)
from airflow_batch_provider.chunking.tables import DEFAULT_BATCH_ROWS, TableReader, select_columns
from airflow_batch_provider.chunking.templates import PromptTemplate
from airflow_batch_provider.chunking.validation import check_utf8
from airflow_batch_provider.chunking.writer import ChunkWriter, WrittenChunk, check_line_sizes, rows_batch, rows_schema
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import ChunkLimitError, InvalidInputError
from airflow_batch_provider.job_folder import ChunkFiles, JobFolder
from airflow_batch_provider.utils.arrow_memory import returning_memory
from airflow_batch_provider.utils.background import run_ahead
from airflow_batch_provider.utils.checks import check_int
from airflow_batch_provider.utils.storage import AnyPath, remove_tree

DEFAULT_CHUNK_SIZE = 5_000


@dataclass(frozen=True)
class ChunkResult:
    """What :func:`build_chunks` published, plus totals for logging."""

    descriptors: list[ChunkDescriptor]  # as in the manifest: schema and carried rows included
    num_rows: int
    num_bytes: int  # of the requests files as rendered, before unchanged rows were dropped
    derived_ids: int  # Anthropic ids rewritten to "h-<sha256>" because the user's id did not fit
    seconds: float
    skipped: SkipStats | None = None  # what skip_unchanged carried (None without previous_output)


def check_chunk_size(chunk_size: int, provider: str) -> int:
    """Return ``chunk_size`` or raise InvalidInputError unless it is 1 … the provider's max requests."""
    return check_int("chunk_size", chunk_size, 1, get_backend(provider).limits.max_requests, suffix=f" for {provider}")


def check_byte_cap(byte_cap: int | None, provider: str) -> int:
    """Return ``byte_cap`` (the provider's default when None) or raise unless 1 … the provider's max bytes."""
    limits = get_backend(provider).limits
    if byte_cap is None:
        return limits.default_byte_cap
    return check_int("byte_cap", byte_cap, 1, limits.max_bytes, suffix=f" bytes for {provider}")


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
    largest = get_backend(provider).limits.max_requests
    bigger = f"increase chunk_size to at least {needed:,} (at most {largest:,} for {provider})"
    raise ChunkLimitError(
        f"The table gives {num_chunks:,} chunks of up to {chunk_size:,} requests, but Airflow maps a task over at "
        f"most [core] max_map_length = {limit:,} items, so the mapped submit step could not expand. Raise "
        f"AIRFLOW__CORE__MAX_MAP_LENGTH to at least {num_chunks:,} (for the scheduler and API server as well as the "
        f"workers){f', or {bigger}' if needed <= largest else ''}; see docs/performance.md."
    )


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
    previous_output: str | None = None,
    carry_statuses: Collection[str] = DEFAULT_CARRY_STATUSES,
) -> ChunkResult:
    """Validate ``source`` and publish it as chunk files under ``job_dir/chunks``; return descriptors and totals.

    ``template`` is a ``str.format`` prompt over the table's columns. ``id_column`` gives each
    request's custom_id (values cast to text); without it the id is ``row-`` plus 16 hex chars of
    a hash of the row's values, so identical rows are reported as duplicates. A chunk closes at
    ``chunk_size`` requests or before a line would take it past ``byte_cap`` bytes (default: the
    provider's safe cap). ``columns`` limits the source columns read and kept in the rows files
    (template and id columns are always kept). With ``spec.json_schema`` the schema is saved next
    to the chunks; with ``previous_output`` (a merged dataset) rows whose request did not change
    keep their stored result, if its status is in ``carry_statuses``, instead of being sent
    (:mod:`airflow_batch_provider.chunking.incremental`). Raises InvalidInputError (ChunkLimitError
    for size limits) naming the rows and columns at fault; nothing is left in ``job_dir`` then.
    """
    started = time.monotonic()
    chunk_size = check_chunk_size(chunk_size, spec.provider)
    byte_cap = check_byte_cap(byte_cap, spec.provider)
    check_int("batch_rows", batch_rows, 1)
    prompt = template if isinstance(template, PromptTemplate) else PromptTemplate(template)
    reader = TableReader(source, batch_rows=batch_rows, string_columns=[*prompt.fields, *filter(None, [id_column])])
    selected = select_columns(reader.schema(), prompt, id_column, columns)

    job = JobFolder(job_dir)
    created_job_dir = not job.path.exists()
    if not created_job_dir:
        remove_leftovers(job)
    staging = job.new_staging()
    writer = ChunkWriter(staging, chunk_size=chunk_size, byte_cap=byte_cap)
    try:
        staging.folder.mkdir(parents=True, exist_ok=True)
        ids = IdBuilder(spec.limits, id_column, selected)
        with returning_memory():  # flat RSS: freed batch buffers go back to the OS at once
            num_rows = _write_table(reader, selected, prompt, renderer_for(spec), ids, writer, byte_cap)
            chunks = _rebalance_tail(staging, writer.finish(), spec.limits, byte_cap)
        descriptors, skipped = _finish_staging(job, staging, spec, chunks, previous_output, carry_statuses)
        publish(job, staging)
    except BaseException:
        _discard(writer, staging, job if created_job_dir else None)
        raise
    return ChunkResult(
        descriptors=descriptors,
        num_rows=num_rows,
        num_bytes=sum(chunk.num_bytes for chunk in chunks),
        derived_ids=ids.derived,
        seconds=time.monotonic() - started,
        skipped=skipped,
    )


def _rebalance_tail(
    staging: ChunkFiles, chunks: list[WrittenChunk], limits: ProviderLimits, byte_cap: int
) -> list[WrittenChunk]:
    """Merge or even out a last chunk under the provider's minimum (see :mod:`.min_records`)."""
    if not needs_rebalance([chunk.num_requests for chunk in chunks], limits):
        return chunks
    *head, previous, last = chunks

    def files(index: int) -> tuple[AnyPath, AnyPath]:
        return staging.requests(index), staging.rows(index)

    new = rebalance_tail(files(previous.index), files(last.index), limits, byte_cap)
    rewritten = [WrittenChunk(previous.index + i, count, size, sha) for i, (count, size, sha) in enumerate(new)]
    return [*head, *rewritten]


def _discard(writer: ChunkWriter, staging: ChunkFiles, created_job: JobFolder | None) -> None:
    """Stop writing and remove the staging folder (and the job folder when this run created it)."""
    writer.abort()
    remove_tree(staging.folder)
    if created_job is not None and isinstance(created_job.path, Path):
        try:
            created_job.path.rmdir()  # only succeeds when empty: never removes anything of someone else's
        except OSError:
            pass


def _write_table(
    reader: TableReader,
    selected: Sequence[str],
    prompt: PromptTemplate,
    renderer: RequestRenderer,
    ids: IdBuilder,
    writer: ChunkWriter,
    byte_cap: int,
) -> int:
    """Validate, render and write every row into ``writer``; return the row count or raise naming bad rows."""
    problems = RowProblems()
    context = ContextCheck.for_spec(renderer.spec)
    schema: pa.Schema | None = None
    num_rows = 0
    with closing(IdHashes()) as hashes:
        prepared = _prepared(reader, selected, prompt, renderer, ids, problems, hashes)
        # Two stages overlap: the next batch is read and rendered by Arrow kernels (GIL released)
        # while this thread hashes the fingerprints (GIL held); other threads write the files.
        for batch, custom_ids, lines, bodies in run_ahead(prepared, depth=1, name="chunk-render"):
            rendered = RenderedRequests(lines, renderer.fingerprints(bodies))
            check_line_sizes(rendered.sizes, byte_cap, ids.limits, num_rows, custom_ids)
            if context is not None:
                context.check(rendered, custom_ids, offset=num_rows, problems=problems)
            if not problems:  # after the first bad row only validate: the staging folder is discarded
                if schema is None:
                    schema = rows_schema(batch.schema)
                writer.write(rendered, rows_batch(batch, custom_ids, rendered.fingerprints, schema))
            num_rows += batch.num_rows
        if num_rows == 0:
            raise InvalidInputError(f"The table {reader.source} has no rows; there is nothing to submit.")
        report_duplicates(hashes, reader, selected, ids.limits, ids.id_column, problems)
    problems.raise_if_any(f"The table {reader.source}")
    return num_rows


def _prepared(
    reader: TableReader,
    selected: Sequence[str],
    prompt: PromptTemplate,
    renderer: RequestRenderer,
    ids: IdBuilder,
    problems: RowProblems,
    hashes: IdHashes,
) -> Iterator[tuple[pa.RecordBatch, pa.Array, pa.Array, pa.Array]]:
    """Read, validate and render each batch (run ahead in a background thread by :func:`_write_table`)."""
    offset = 0
    for batch in reader.batches(selected):
        check_utf8(batch, offset=offset, problems=problems, what=f"The table {reader.source}")
        # Each row's request body after its custom_id (the prompt as JSON + the rest), in one pass.
        bodies = prompt.render_json(batch, offset=offset, problems=problems, suffix=renderer.body_suffix)
        custom_ids = ids.build(batch, offset=offset, problems=problems)
        hashes.add(id_hashes(custom_ids))
        yield batch, custom_ids, renderer.lines_of(custom_ids, bodies), bodies
        offset += batch.num_rows


def _finish_staging(
    job: JobFolder,
    staging: ChunkFiles,
    spec: RequestSpec,
    chunks: list[WrittenChunk],
    previous_output: str | None,
    carry_statuses: Collection[str],
) -> tuple[list[ChunkDescriptor], SkipStats | None]:
    """Add the schema and the carried rows to the staging folder, then the manifest with the final descriptors."""
    descriptors = chunk_descriptors(job, spec, chunks)
    if spec.json_schema is not None:
        descriptors = with_schema(descriptors, spec.json_schema, job, staging)
    skipped = None
    if previous_output:
        previous = load_previous(previous_output, carry_statuses)
        descriptors, skipped = apply_skip_unchanged(descriptors, previous, staging, job.chunks)
    write_manifest(staging, descriptors)
    return descriptors, skipped
