"""Every path under a job folder and an output folder: the on-disk contract between the stages.

One job folder per ChunkOperator run (by default ``<[llm_batch] work_dir>/<dag_id>/<run folder>/<task_id>``,
see :func:`default_job_dir`); each stage writes only its own part of it::

    job_dir/
      chunks/                                 the chunk step's output, published whole (see below)
        chunk-00000.jsonl                     requests, one per line
        chunk-00000.rows.parquet              source columns + custom_id + request_fingerprint
        chunk-00000.carry.parquet             stored results of unchanged rows (skip_unchanged)
        schema.json                           the structured-output JSON Schema
        manifest.json                         the ChunkDescriptor list, written last
      .staging-<hex>/                         the chunk step at work: the same names as chunks/
      .old-chunks-<hex>/                      a replaced chunks/ folder, being removed
      retries/chunk-00000.attempt-2.jsonl     the lines attempt 1 left retryable (line retries)
      retries/cancelled/<batch_id>.json       "we cancelled this batch" markers (id made safe: batch_file_name)
      retries/chunk-00000.resend.jsonl        the rows a self-hosted retry sends again (removed after)
      results/chunk-00000.output.jsonl        answers of self-hosted generation (vLLM, servers)
      results/chunk-00000.output.meta.json    ... and the sidecar that says the file is complete
      merged.json                             written once the run merged; its request bodies removed

    output_dir/                               the merge step's dataset
      part-00000.parquet                      one part per chunk, same index
      _SUMMARY.json                           the job summary
      .part-00000.parquet.<hex>.tmp           a part being written (or left by a killed merge)

The chunk step writes into a staging folder and moves it to ``chunks/`` only when every file,
the manifest last, is there; published files are never rewritten. Paths may be local or any
``ObjectStoragePath`` URL. This module imports nothing above :mod:`airflow_batch_provider.utils`
(and :mod:`~airflow_batch_provider.settings`, which imports Airflow only when read), so publishing
and retention code can use it too.

Names that come from outside never reach a path as they are: a run_id becomes a readable folder
name plus 8 hex of its hash (:func:`run_folder_name`), a provider's batch id a safe file name
(:func:`batch_file_name`).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid

from airflow_batch_provider import settings
from airflow_batch_provider.utils.storage import AnyPath, to_path

CHUNKS_DIR = "chunks"
RETRIES_DIR = "retries"
CANCELLED_DIR = "cancelled"
RESULTS_DIR = "results"
MANIFEST_NAME = "manifest.json"
SCHEMA_NAME = "schema.json"
SUMMARY_NAME = "_SUMMARY.json"
MERGED_NAME = "merged.json"
STAGING_PREFIX = ".staging-"
REPLACED_PREFIX = f".old-{CHUNKS_DIR}-"
_UNSAFE_PATH_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_PLAIN_BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def sanitise_path_part(text: str) -> str:
    """Return ``text`` with every run of characters outside ``[A-Za-z0-9._-]`` replaced by ``_``."""
    cleaned = _UNSAFE_PATH_CHARS.sub("_", text).strip("._")
    return cleaned or "_"


def run_folder_name(run_id: str) -> str:
    """Return a readable folder name that is unique per run_id: the cleaned run_id plus 8 hex of its hash.

    Cleaning alone maps ``a:b``, ``a+b``, ``a/b`` and ``a_b`` to one name (Airflow's run_id pattern
    allows ``:``, ``+`` and ``~``), and two runs would then share — and overwrite — one job folder.
    """
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:8]
    return f"{sanitise_path_part(run_id)[:120]}-{digest}"


def default_job_dir(dag_id: str, run_id: str, task_dir: str) -> str:
    """Return the default job folder: ``<[llm_batch] work_dir>/<dag_id>/<run folder>/<task_dir>`` (parts made safe)."""
    return os.path.join(
        settings.work_dir(), sanitise_path_part(dag_id), run_folder_name(run_id), sanitise_path_part(task_dir)
    )


def batch_file_name(batch_id: str) -> str:
    """Return a file name for a provider-supplied ``batch_id`` that cannot leave its folder.

    Ids such as ``batch_abc123`` or ``msgbatch_01…`` are used as they are. Anything else (``../../x``,
    an ARN with ``/`` and ``:``, an over-long id) is cleaned to ``[A-Za-z0-9_-]`` and given 12 hex of
    its sha256, so two different ids never share a file.
    """
    if _PLAIN_BATCH_ID.fullmatch(batch_id) and ".." not in batch_id:
        return batch_id
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", batch_id).strip("_")[:80] or "batch"
    return f"{cleaned}-{hashlib.sha256(batch_id.encode('utf-8')).hexdigest()[:12]}"


def chunk_stem(index: int) -> str:
    """Return the name every file of chunk ``index`` starts with: ``chunk-00003``."""
    return f"chunk-{int(index):05d}"


def part_name(chunk_index: int) -> str:
    """Return the deterministic file name of a chunk's output part: ``part-00003.parquet``."""
    return f"part-{int(chunk_index):05d}.parquet"


class ChunkFiles:
    """The files of a chunks folder: the published ``chunks/`` or a staging folder (same names)."""

    def __init__(self, folder: AnyPath) -> None:
        self.folder = folder

    def requests(self, index: int) -> AnyPath:
        """Return chunk ``index``'s requests file (JSONL)."""
        return self.folder / f"{chunk_stem(index)}.jsonl"

    def rows(self, index: int) -> AnyPath:
        """Return chunk ``index``'s rows file (parquet)."""
        return self.folder / f"{chunk_stem(index)}.rows.parquet"

    def carry(self, index: int) -> AnyPath:
        """Return chunk ``index``'s carried results (parquet; only with skip_unchanged)."""
        return self.folder / f"{chunk_stem(index)}.carry.parquet"

    @property
    def manifest(self) -> AnyPath:
        """Return the manifest: the ChunkDescriptor list, the last file written."""
        return self.folder / MANIFEST_NAME

    @property
    def schema(self) -> AnyPath:
        """Return the structured-output JSON Schema file."""
        return self.folder / SCHEMA_NAME


class JobFolder:
    """The folder of one job: chunk files, line retries, cancel markers and self-hosted results."""

    def __init__(self, job_dir: str | os.PathLike[str]) -> None:
        self.path = to_path(job_dir)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def chunks(self) -> ChunkFiles:
        """Return the published chunk files."""
        return ChunkFiles(self.path / CHUNKS_DIR)

    def new_staging(self) -> ChunkFiles:
        """Return a fresh, uniquely named staging folder (not created yet) for the chunk step."""
        return ChunkFiles(self.path / f"{STAGING_PREFIX}{uuid.uuid4().hex}")

    def new_replaced(self) -> AnyPath:
        """Return a unique name to move the old ``chunks/`` folder to while it is replaced."""
        return self.path / f"{REPLACED_PREFIX}{uuid.uuid4().hex}"

    @staticmethod
    def is_leftover(name: str) -> bool:
        """Return True for a staging or replaced folder that a killed chunk step left behind."""
        return name.startswith((STAGING_PREFIX, REPLACED_PREFIX))

    def retry_requests(self, chunk_index: int, attempt: int) -> AnyPath:
        """Return the requests file of a chunk's follow-up batch ``attempt`` (2, 3 ...)."""
        return self.path / RETRIES_DIR / f"{chunk_stem(chunk_index)}.attempt-{int(attempt)}.jsonl"

    def resend_requests(self, chunk_index: int) -> AnyPath:
        """Return the requests file of the rows a self-hosted retry sends again (those that failed retryably)."""
        return self.path / RETRIES_DIR / f"{chunk_stem(chunk_index)}.resend.jsonl"

    def cancel_marker(self, batch_id: str) -> AnyPath:
        """Return the marker that says this package cancelled ``batch_id`` (the id made a safe file name)."""
        return self.path / RETRIES_DIR / CANCELLED_DIR / f"{batch_file_name(batch_id)}.json"

    def retry_requests_of(self, chunk_index: int) -> list[AnyPath]:
        """Return every follow-up requests file of chunk ``chunk_index`` that exists (attempts 2, 3 ...)."""
        folder = self.path / RETRIES_DIR
        if not folder.exists():
            return []
        prefix = f"{chunk_stem(chunk_index)}.attempt-"
        return sorted(p for p in folder.iterdir() if p.name.startswith(prefix) and p.name.endswith(".jsonl"))

    @property
    def merged_record(self) -> AnyPath:
        """Return ``merged.json``: when the run merged and what retention removed (jobs/retention.py)."""
        return self.path / MERGED_NAME

    @staticmethod
    def looks_like_job(names: set[str]) -> bool:
        """Return True when a folder holding ``names`` is a job folder (for ``jobs gc``)."""
        return CHUNKS_DIR in names or MERGED_NAME in names or any(JobFolder.is_leftover(n) for n in names)

    @staticmethod
    def file_exists(path: str) -> bool:
        """Return True when ``path`` (local or object storage) exists."""
        return bool(to_path(path).exists())

    def results(self, chunk_index: int, results_dir: str | None = None) -> AnyPath:
        """Return the self-hosted answers of a chunk, in ``results_dir`` or ``job_dir/results``."""
        folder = to_path(results_dir) if results_dir else self.path / RESULTS_DIR
        return folder / f"{chunk_stem(chunk_index)}.output.jsonl"


def results_meta(output_path: str) -> str:
    """Return the sidecar of a results file (``….output.jsonl`` → ``….output.meta.json``)."""
    stem = output_path[: -len(".jsonl")] if output_path.endswith(".jsonl") else output_path
    return f"{stem}.meta.json"


class OutputFolder:
    """The merge step's dataset: one parquet part per chunk and the job summary."""

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        self.path = to_path(output_dir)

    def __str__(self) -> str:
        return str(self.path)

    def part(self, chunk_index: int) -> AnyPath:
        """Return the output part of chunk ``chunk_index``."""
        return self.path / part_name(chunk_index)

    @property
    def summary(self) -> AnyPath:
        """Return the job summary file."""
        return self.path / SUMMARY_NAME

    @staticmethod
    def is_part(name: str) -> bool:
        """Return True for an output part's file name."""
        return name.startswith("part-") and name.endswith(".parquet")

    @staticmethod
    def is_unfinished_part(name: str) -> bool:
        """Return True for a part's temporary (``.part-NNNNN.parquet.<id>.tmp``): readers skip it."""
        return name.startswith(".part-") and name.endswith(".tmp")

    def parts(self) -> list[AnyPath]:
        """Return the existing part files, in chunk order (none when the folder does not exist)."""
        if not self.path.exists():
            return []
        return sorted((p for p in self.path.iterdir() if self.is_part(p.name)), key=lambda p: p.name)
