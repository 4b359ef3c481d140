"""Finish and publish the chunk step's staging folder: schema, descriptors, manifest, then the move.

Everything the chunk step writes goes into ``job_dir/.staging-<hex>/`` (names in
:mod:`airflow_batch_provider.job_folder`). Only when every file is final — chunk files, the
schema, the carried rows of ``skip_unchanged`` — is the manifest written, last, and the folder
moved to ``job_dir/chunks/``, replacing an older one whole. Published files are never rewritten.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from airflow_batch_provider.chunking.spec import RequestSpec
from airflow_batch_provider.chunking.writer import WrittenChunk
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.job_folder import ChunkFiles, JobFolder
from airflow_batch_provider.utils import storage
from airflow_batch_provider.utils.storage import remove_tree


def chunk_descriptors(job: JobFolder, spec: RequestSpec, chunks: list[WrittenChunk]) -> list[ChunkDescriptor]:
    """Return one descriptor per written chunk, naming the files where they will be published."""
    final = job.chunks
    total = len(chunks)
    return [
        ChunkDescriptor(
            job_dir=str(job),
            chunk_index=chunk.index,
            num_chunks=total,
            provider=spec.provider,
            endpoint=spec.endpoint or "",
            model=spec.model,
            requests_path=str(final.requests(chunk.index)),
            rows_path=str(final.rows(chunk.index)),
            num_requests=chunk.num_requests,
            num_bytes=chunk.num_bytes,
            fingerprint=chunk.fingerprint,
            label=f"chunk {chunk.index + 1}/{total} ({chunk.num_requests:,} req)",
        )
        for chunk in chunks
    ]


def save_schema(schema: dict[str, Any], path: storage.AnyPath) -> None:
    """Write the job's structured-output JSON Schema (read back by the merge step's validator)."""
    with path.open("wb") as out:
        out.write(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))


def with_schema(
    descriptors: list[ChunkDescriptor], schema: dict[str, Any], job: JobFolder, staging: ChunkFiles
) -> list[ChunkDescriptor]:
    """Save ``schema`` in the staging folder and name its published path in every descriptor."""
    save_schema(schema, staging.schema)
    schema_path = str(job.chunks.schema)
    return [ChunkDescriptor(**d, schema_path=schema_path) for d in descriptors]


def write_manifest(files: ChunkFiles, descriptors: list[ChunkDescriptor]) -> None:
    """Write the descriptor list: the last file of a chunks folder, so its presence means "complete"."""
    with files.manifest.open("wb") as handle:
        handle.write(orjson.dumps(descriptors, option=orjson.OPT_INDENT_2) + b"\n")


def publish(job: JobFolder, staging: ChunkFiles) -> None:
    """Move the staging folder to ``chunks/``, replacing an older one (never merging with it)."""
    final = job.chunks.folder
    old = None
    if final.exists():
        old = job.new_replaced()
        _move(final, old)
    _move(staging.folder, final)
    if old is not None:
        remove_tree(old)


def remove_leftovers(job: JobFolder) -> None:
    """Remove staging and replaced folders that a killed earlier attempt left in the job folder.

    A job_dir belongs to one task, so any such folder is garbage (possibly gigabytes of it).
    """
    for child in job.path.iterdir():
        if job.is_leftover(child.name):
            remove_tree(child)


def _move(src: storage.AnyPath, dst: storage.AnyPath) -> None:
    if isinstance(src, Path):
        os.replace(src, str(dst))
    else:
        # Object stores have no folder rename: fsspec copies then deletes each object.
        src.fs.mv(src.path, dst.path, recursive=True)  # type: ignore[union-attr]
