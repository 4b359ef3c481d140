"""Line-level retries: which failed lines are worth sending again, and the follow-up files that carry them.

A batch that ends ``completed`` (or ``expired``) can still hold lines that failed for a passing
reason. BatchCompleteSensor sends those lines again as a smaller follow-up batch — attempt 2,
then attempt 3, up to ``max_line_retries`` follow-ups — built from the chunk's *original*
requests file filtered by custom_id::

    job_dir/retries/chunk-00003.attempt-2.jsonl     the lines attempt 1 left retryable
    job_dir/retries/chunk-00003.attempt-3.jsonl     the lines attempt 2 left retryable

A line is **retryable** (see :func:`is_retryable`) when the provider never really answered it:

- HTTP 408/409/429 or 5xx responses, and error codes of the server-error / rate-limit class,
  in each provider's vocabulary (its backend's ``retryable_line_errors``: OpenAI's
  ``server_error``, Anthropic's ``overloaded_error`` ...);
- ``expired`` lines (OpenAI ``batch_expired`` error-file lines, Anthropic ``expired`` results);
- ``canceled`` lines, unless this task cancelled the batch (a batch someone else cancelled
  stops the task instead — the sensor raises BatchCancelledError);
- ``missing`` lines: no result line at all.

Everything else is final: 400-class invalid requests, authentication or permission errors, an
unknown error code, ``invalid_output``. Sending those again would only pay twice for the same
error. MergeResultsOperator later reads every attempt in order; the last result per custom_id wins.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import orjson

from airflow_batch_provider.backends.registry import all_backends
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord
from airflow_batch_provider.exceptions import ResultsError
from airflow_batch_provider.job_folder import JobFolder
from airflow_batch_provider.jobs.retention import require_requests_file
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.utils.storage import atomic_write, to_path

if TYPE_CHECKING:
    from airflow_batch_provider.backends.base import Backend
    from airflow_batch_provider.hooks.base import BatchHook

log = logging.getLogger(__name__)

DEFAULT_MAX_LINE_RETRIES = 2
EXAMPLE_IDS = 3  # custom_ids kept per failure kind of an attempt (shown by the "LLM batches" view)
MISSING_KIND = "missing/-: no result line"

#: The code this package writes itself into self-hosted output lines when the server could not be reached.
_OWN_RETRYABLE_CODES = frozenset({"connection_error"})
_RETRYABLE_HTTP = frozenset({408, 409, 429})


def retryable_codes() -> frozenset[str]:
    """Return the error codes that mean "try again": every backend's ``retryable_line_errors``, and ours.

    One set for all providers: a merged output row keeps its code but not its provider, and the
    codes of different providers do not collide.
    """
    return _union_of(all_backends())


@functools.cache
def _union_of(backends: tuple[Backend, ...]) -> frozenset[str]:  # cached: asked once per merged row
    return _OWN_RETRYABLE_CODES.union(*(backend.retryable_line_errors for backend in backends))


def is_retryable(record: ResultRecord, *, cancelled_by_us: bool = False) -> bool:
    """Return True when a failed result line should be sent again in a follow-up batch."""
    status = record["status"]
    if status in ("succeeded", "invalid_output"):
        return False
    if status in ("expired", "missing"):
        return True
    if status == "canceled":
        return not cancelled_by_us
    http = record.get("http_status")
    if http is not None:
        return http in _RETRYABLE_HTTP or http >= 500
    return (record.get("error_code") or "") in retryable_codes()


def output_error_code(record: ResultRecord) -> str | None:
    """Return the ``error_code`` a failed row keeps in the merged output: the provider's code, else ``http_NNN``.

    The output holds no HTTP status, so a code-less HTTP error keeps its status in the code; that
    is enough for :func:`is_final_error_code` to judge the row on a later run.
    """
    if record["status"] == "succeeded":
        return None
    code = record.get("error_code")
    http = record.get("http_status")
    if http is None or http == 200:
        return code
    by_http = f"http_{http}"
    # is_retryable judges a row with an HTTP status by the status alone: keep the verdict the same.
    if not code or is_final_error_code(code) != is_final_error_code(by_http):
        return by_http
    return code


def is_final_error_code(code: str | None) -> bool:
    """Return True when an ``errored`` row with this output ``error_code`` would fail the same way again.

    No code (nothing to judge by), an HTTP 408/409/429/5xx status and the codes of
    :func:`retryable_codes` are not final: such rows are sent again.
    """
    if not code:
        return False
    if code.startswith("http_") and code[5:].isdigit():
        http = int(code[5:])
        return not (http in _RETRYABLE_HTTP or http >= 500)
    return code not in retryable_codes()


def describe_failure(record: ResultRecord) -> str:
    """Return a short ``status/code: message`` text that groups equal failures in logs and errors."""
    code = record.get("error_code") or (f"HTTP {record['http_status']}" if record.get("http_status") else "-")
    message = (record.get("error") or "").strip().replace("\n", " ")
    if len(message) > 120:
        message = message[:117] + "..."
    return f"{record['status']}/{code}: {message}" if message else f"{record['status']}/{code}"


# ---------------------------------------------------------------------------------------- files


def retry_path(job_dir: str, chunk_index: int, attempt: int) -> str:
    """Return the requests file of follow-up ``attempt`` (2, 3, ...) of a chunk."""
    return str(JobFolder(job_dir).retry_requests(chunk_index, attempt))


def attempt_requests_path(chunk: Mapping[str, Any], attempt: int) -> str:
    """Return the requests file that attempt ``attempt`` of ``chunk`` sent (1 is the chunk file itself)."""
    if attempt <= 1:
        return str(chunk["requests_path"])
    return retry_path(chunk["job_dir"], chunk["chunk_index"], attempt)


def _custom_id(line: bytes, path: str, number: int) -> str:
    try:
        custom_id = orjson.loads(line)["custom_id"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ResultsError(f"{path}, line {number}: not a request line with a custom_id ({exc})") from exc
    return str(custom_id)


def read_custom_ids(path: str) -> list[str]:
    """Return the custom_ids of a requests file, in file order."""
    ids: list[str] = []
    with to_path(path).open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                ids.append(_custom_id(line, path, number))
    return ids


@dataclass(frozen=True)
class FollowUpFile:
    """A follow-up requests file as written: where, how many lines and bytes, and its sha256."""

    path: str
    num_requests: int
    num_bytes: int
    fingerprint: str


def write_followup(source_path: str, custom_ids: Collection[str], dest_path: str) -> FollowUpFile:
    """Write the lines of ``source_path`` whose custom_id is in ``custom_ids`` to ``dest_path`` (crash-safe).

    Lines keep their original bytes and order, so the same ids always give the same file.
    Raises ResultsError when an id is not in the source file (the results belong to another chunk).
    """
    wanted = set(custom_ids)
    digest = hashlib.sha256()
    found: set[str] = set()
    num_bytes = 0
    with to_path(source_path).open("rb") as handle, atomic_write(dest_path) as out:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            custom_id = _custom_id(raw, source_path, number)
            if custom_id in wanted and custom_id not in found:
                line = raw if raw.endswith(b"\n") else raw + b"\n"
                out.write(line)
                digest.update(line)
                num_bytes += len(line)
                found.add(custom_id)
        unknown = wanted - found
        if unknown:  # raised inside the write: the half-built file is discarded
            sample = sorted(unknown)[:5]
            raise ResultsError(
                f"{len(unknown)} custom_id(s) to retry are not in {source_path} (e.g. {sample}): "
                "the batch's results do not belong to this chunk."
            )
    return FollowUpFile(dest_path, len(found), num_bytes, digest.hexdigest())


_CHUNK_KEYS = (
    "job_dir",
    "chunk_index",
    "num_chunks",
    "provider",
    "endpoint",
    "model",
    "requests_path",
    "rows_path",
    "num_requests",
    "num_bytes",
    "fingerprint",
    "label",
    "schema_path",
)


def chunk_of(batch: Mapping[str, Any]) -> ChunkDescriptor:
    """Return the plain chunk descriptor inside a submitted or completed batch record."""
    return cast(ChunkDescriptor, {key: batch[key] for key in _CHUNK_KEYS if key in batch})


def followup_chunk(chunk: Mapping[str, Any], attempt: int, written: FollowUpFile) -> ChunkDescriptor:
    """Return the chunk descriptor of follow-up ``attempt``: the chunk, pointed at its retry file."""
    followup = dict(chunk_of(chunk))
    followup.update(
        requests_path=written.path,
        num_requests=written.num_requests,
        num_bytes=written.num_bytes,
        fingerprint=written.fingerprint,
        label=f"{chunk['label']} attempt {attempt}",
    )
    return cast(ChunkDescriptor, followup)


def describe_file(path: str) -> FollowUpFile:
    """Return the line count, size and sha256 of an existing requests file."""
    digest = hashlib.sha256()
    lines = size = 0
    with to_path(path).open("rb") as handle:
        for raw in handle:
            digest.update(raw)
            size += len(raw)
            lines += 1 if raw.strip() else 0
    return FollowUpFile(path, lines, size, digest.hexdigest())


def _cancel_marker(job_dir: str, batch_id: str) -> str:
    return str(JobFolder(job_dir).cancel_marker(batch_id))


def mark_cancelled_by_us(job_dir: str, batch_id: str, why: str) -> None:
    """Leave a marker saying this pipeline cancelled ``batch_id`` (readable by any later task run)."""
    with atomic_write(_cancel_marker(job_dir, batch_id)) as out:
        out.write(orjson.dumps({"batch_id": batch_id, "why": why, "at": time.time()}))


def cancelled_by_us(job_dir: str | None, batch_id: str) -> str | None:
    """Return why this pipeline cancelled ``batch_id`` (from its marker), or None when it did not."""
    if not job_dir:
        return None
    path = to_path(_cancel_marker(job_dir, batch_id))
    try:
        return str(orjson.loads(path.read_bytes()).get("why") or "cancelled by this pipeline")
    except (FileNotFoundError, orjson.JSONDecodeError, AttributeError):
        return None


# ------------------------------------------------------------------------------------ decisions


@dataclass
class AttemptScan:
    """What one ended attempt left behind: the lines to send again and the final failures."""

    retry_ids: list[str] = field(default_factory=list)
    final_failures: Counter[str] = field(default_factory=Counter)
    retryable: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)  # failure kind -> its first custom_ids (the view)

    @property
    def final_failed(self) -> int:
        """Return how many lines failed for good in this attempt."""
        return sum(self.final_failures.values())


def nothing_to_retry(state: BatchState) -> bool:
    """Return True when the provider's counters already say every line succeeded (no download needed)."""
    counts = state.counts
    return counts.total > 0 and counts.completed >= counts.total


def scan_attempt(
    failed: Iterable[ResultRecord],
    *,
    state: BatchState,
    requested: Callable[[], list[str]],
    all_results: Callable[[], Iterable[ResultRecord]],
    cancelled_by_us: bool = False,
) -> AttemptScan:
    """Sort one attempt's failed results into retryable and final ones.

    ``failed`` yields at least every non-succeeded result (a hook may skip the successes, as the
    OpenAI hook does by reading only the error file). When the provider's counters show lines
    that have no result at all, ``requested`` (the attempt's custom_ids) and ``all_results`` are
    used to find them; they count as ``missing`` and are retryable.
    """
    scan = AttemptScan()
    seen_failed: set[str] = set()
    for record in failed:
        if record["status"] == "succeeded" or record["custom_id"] in seen_failed:
            continue
        seen_failed.add(record["custom_id"])
        kind = describe_failure(record)
        if is_retryable(record, cancelled_by_us=cancelled_by_us):
            scan.retry_ids.append(record["custom_id"])
            scan.retryable[kind] += 1
        else:
            scan.final_failures[kind] += 1
        if len(examples := scan.examples.setdefault(kind, [])) < EXAMPLE_IDS:
            examples.append(record["custom_id"])
    expected = state.counts.total
    if expected and state.counts.completed + len(seen_failed) < expected:
        answered = {r["custom_id"] for r in all_results()}
        missing = [cid for cid in requested() if cid not in answered]
        if missing:
            log.warning("batch %s: %d line(s) have no result at all; they are retried", state.batch_id, len(missing))
            scan.retry_ids.extend(missing)
            scan.retryable[MISSING_KIND] += len(missing)
            scan.examples[MISSING_KIND] = missing[:EXAMPLE_IDS]
    return scan


def plan_followup(
    hook: BatchHook, batch: Mapping[str, Any], state: BatchState, attempt: int
) -> tuple[AttemptScan, FollowUpFile | None]:
    """Scan ended attempt ``attempt`` of ``batch``; write attempt ``attempt + 1``'s file when a line is retryable."""
    scan = scan_attempt(
        hook.iter_failed_results(state),
        state=state,
        requested=lambda: read_custom_ids(attempt_requests_path(batch, attempt)),
        all_results=lambda: hook.iter_results(state),
    )
    if not scan.retry_ids:
        return scan, None
    dest = retry_path(batch["job_dir"], batch["chunk_index"], attempt + 1)
    require_requests_file(batch["requests_path"], batch["label"])  # retention may have removed it
    return scan, write_followup(batch["requests_path"], scan.retry_ids, dest)


def attempt_chunk(batch: Mapping[str, Any], attempt: int) -> ChunkDescriptor:
    """Return the chunk descriptor that attempt ``attempt`` sent (to send the same lines again)."""
    if attempt <= 1:
        return chunk_of(batch)
    return followup_chunk(batch, attempt, describe_file(attempt_requests_path(batch, attempt)))
