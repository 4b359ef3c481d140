"""Retention of a job folder: what a merged run keeps, and garbage collection of old job folders.

Once the merge of a run has succeeded, the request bodies (``chunks/chunk-NNNNN.jsonl`` and the
line retries' ``retries/chunk-NNNNN.attempt-N.jsonl``) are no longer needed: the provider has
answered every line and the answers are in the output dataset. They are ~90 % of a job folder
(~490 bytes a row for a short chat prompt), so :func:`release_after_merge` removes them and
writes ``merged.json`` (when, where the output went, what was removed and how many bytes).

What stays, and why (docs/retention.md):

- ``chunks/manifest.json``, ``chunks/schema.json`` and the rows files (``*.rows.parquet``,
  ``*.carry.parquet``): a clear of the merge re-reads the answers from the provider (or
  ``results/``) and joins them onto the rows files; an audit sees which rows went out under
  which custom_id and request fingerprint;
- ``retries/cancelled/``: the markers that say this package cancelled a batch;
- ``results/``: self-hosted answers (vLLM, servers), which only a new GPU run could reproduce.

A clear of a submit or wait after that finds its checkpoint and re-attaches to its batch without
the request file; one that would have to upload it again fails with a message that says to clear
the chunk task too (:func:`require_requests_file`), which rebuilds the same files and, with
``skip_unchanged``, sends nothing that was already answered.

:func:`collect` removes whole job folders: merged ones whose merge is older than a threshold, and
with ``include_unmerged`` the unmerged ones in which nothing changed for that long. A job folder
with no ``merged.json`` and a recent change is treated as running and never touched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.job_folder import JobFolder
from airflow_batch_provider.utils.storage import AnyPath, atomic_write, remove_tree


@dataclass
class Released:
    """What :func:`release_after_merge` removed from one job folder."""

    job_dir: str
    files: list[str] = field(default_factory=list)
    bytes: int = 0


def release_after_merge(batches: Iterable[dict[str, Any]], output_dir: str) -> list[Released]:
    """Remove the request bodies of merged chunks and write each job folder's ``merged.json``.

    Only the files the merged descriptors name are removed (the chunk's requests file, when its
    size is still the descriptor's ``num_bytes``, and that chunk's line-retry request files), so a
    later run that reuses the same ``job_dir`` and has already replaced ``chunks/`` keeps its own.
    """
    by_job: dict[str, list[dict[str, Any]]] = {}
    for batch in batches:
        by_job.setdefault(str(batch["job_dir"]), []).append(batch)
    released = []
    for job_dir, chunks in by_job.items():
        job = JobFolder(job_dir)
        result = Released(job_dir)
        for chunk in chunks:
            candidates = [(job.chunks.requests(chunk["chunk_index"]), chunk.get("num_bytes"))]
            candidates += [(path, None) for path in job.retry_requests_of(chunk["chunk_index"])]
            for path, expected_size in candidates:
                result.bytes += _remove_file(path, expected_size, result.files)
        with atomic_write(str(job.merged_record)) as out:
            out.write(
                orjson.dumps(
                    {
                        "merged_at": datetime.now(UTC).isoformat(),
                        "output_dir": str(output_dir),
                        "chunks": len(chunks),
                        "removed_files": len(result.files),
                        "removed_bytes": result.bytes,
                    },
                    option=orjson.OPT_INDENT_2,
                )
            )
        released.append(result)
    return released


def _remove_file(path: AnyPath, expected_size: int | None, removed: list[str]) -> int:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0  # removed by an earlier merge of this run (a clear), or never written
    if expected_size is not None and size != expected_size:
        return 0  # not the file this run sent: a later run rebuilt chunks/ in the same job_dir
    path.unlink()
    removed.append(str(path))
    return int(size)


def require_requests_file(path: str, chunk_label: str) -> None:
    """Raise a clear error when a chunk's request file is gone (retention removed it after a merge)."""
    if not JobFolder.file_exists(path):
        raise InvalidInputError(
            f"{chunk_label}: its request file {path} no longer exists: the job folder's retention removes "
            "request bodies once the run has merged (docs/retention.md), and this batch has no checkpoint to "
            "re-attach to. Clear the chunk task together with this one: it rebuilds the same files (with "
            "skip_unchanged, rows already answered are carried, not sent again)."
        )


# ------------------------------------------------------------------------------------------- gc


@dataclass
class JobState:
    """One job folder as ``gc`` sees it."""

    path: Path
    merged_at: float | None  # epoch seconds from merged.json; None: not merged (running, failed or abandoned)
    last_change: float  # newest mtime of anything inside
    size: int

    def age(self, now: float) -> float:
        """Seconds since the merge, or for an unmerged job since anything in it last changed."""
        return now - (self.merged_at if self.merged_at is not None else self.last_change)


def parse_age(text: str) -> float:
    """Return seconds for ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` or a plain number of seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    value = text.strip().lower()
    number, unit = (value[:-1], units[value[-1]]) if value and value[-1] in units else (value, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise InvalidInputError(
            f"--older-than {text!r}: write a number and a unit, e.g. 7d, 12h, 30m or 90s."
        ) from None
    if seconds < 0:
        raise InvalidInputError(f"--older-than {text!r} is negative; write e.g. 7d.")
    return seconds


def find_jobs(root: Path) -> Iterator[JobState]:
    """Yield every job folder under ``root``: a folder holding ``chunks/``, ``merged.json`` or a staging folder."""
    for folder, dirs, files in os.walk(root):
        names = set(dirs) | set(files)
        if not JobFolder.looks_like_job(names):
            continue
        dirs[:] = []  # a job folder holds no other job folder
        path = Path(folder)
        yield JobState(path, _merged_at(JobFolder(path)), *_usage(path))


def _merged_at(job: JobFolder) -> float | None:
    try:
        record = orjson.loads(Path(str(job.merged_record)).read_bytes())
        return datetime.fromisoformat(record["merged_at"]).timestamp()
    except (FileNotFoundError, KeyError, ValueError, orjson.JSONDecodeError):
        return None


def _usage(path: Path) -> tuple[float, int]:
    newest, size = path.stat().st_mtime, 0
    for folder, _, files in os.walk(path):
        newest = max(newest, os.stat(folder).st_mtime)
        for name in files:
            try:
                info = os.stat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            newest, size = max(newest, info.st_mtime), size + info.st_size
    return newest, size


@dataclass
class Decision:
    """What ``gc`` did (or, with ``dry_run``, would do) with one job folder, and why."""

    job: JobState
    remove: bool
    reason: str


def collect(
    root: str | os.PathLike[str], older_than_s: float, *, include_unmerged: bool = False, dry_run: bool = False
) -> list[Decision]:
    """Remove the job folders under ``root`` that retention no longer needs; return every decision.

    A merged job folder goes once its merge is older than ``older_than_s``. An unmerged one is a
    run still in progress (its batches at the provider, its sensor deferred) or a failed run a
    user may still clear; it is kept unless ``include_unmerged`` and nothing in it changed for
    ``older_than_s`` (choose that longer than the provider's completion window, 24 h).
    """
    base = Path(root)
    if not base.is_dir():
        raise InvalidInputError(f"{base} is not a folder: pass the job folders' root ([llm_batch] work_dir).")
    now = time.time()
    decisions = []
    for job in sorted(find_jobs(base), key=lambda j: str(j.path)):
        age = job.age(now)
        if job.merged_at is not None:
            remove, reason = age >= older_than_s, f"merged {_days(age)} ago"
        elif age < older_than_s:
            remove, reason = False, f"not merged, changed {_days(age)} ago: treated as running"
        else:
            remove = include_unmerged
            reason = f"not merged, unchanged for {_days(age)}" + ("" if remove else " (kept: no --include-unmerged)")
        decisions.append(Decision(job, remove, reason))
        if remove and not dry_run:
            remove_tree(job.path)
            _remove_empty_parents(job.path.parent, base)
    return decisions


def _remove_empty_parents(folder: Path, root: Path) -> None:
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()  # only when empty: the dag_id / run_id levels of the default layout
        except OSError:
            return
        folder = folder.parent


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f} d" if seconds >= 86400 else f"{seconds / 3600:.1f} h"
