"""Small, JSON-able records passed between tasks through XCom.

No request bodies ever travel through XCom: a chunk descriptor points at the chunk's
files on storage. Every task downstream of ChunkOperator adds keys to the descriptor it
received, so a merge task sees the whole history of one chunk in one dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, TypeVar

ResultStatus = Literal["succeeded", "errored", "expired", "canceled", "missing", "invalid_output"]

#: Columns the merge appends to the source columns, in output order. The chunk step refuses a source
#: column of the same name before anything is uploaded (the merge could not tell the two apart).
RESULT_COLUMNS = (
    "status",
    "response",
    "finish_reason",
    "error",
    "error_code",
    "input_tokens",
    "output_tokens",
    "batch_id",
    "attempts",
)


class ChunkDescriptor(TypedDict):
    """Describe one chunk written by ChunkOperator."""

    job_dir: str
    chunk_index: int
    num_chunks: int
    provider: str
    endpoint: str
    model: str
    requests_path: str  # JSONL, one provider wire-format request per line
    rows_path: str  # parquet: the source columns plus ``custom_id``, in source order
    num_requests: int
    num_bytes: int
    fingerprint: str  # sha256 of the requests file: same bytes, same fingerprint
    label: str  # human name for the mapped task, e.g. "chunk 3/12 (10,000 req)"
    schema_path: NotRequired[str]  # JSON Schema of the expected answer (structured output only)
    # Batch price of this chunk before submission: every answer at max_tokens, and at its expected
    # length (see cost/answers.py); None when the model is unpriced.
    cost_upper_bound_usd: NotRequired[float | None]
    cost_expected_usd: NotRequired[float | None]
    estimated_input_tokens: NotRequired[int]
    carry_path: NotRequired[str]  # stored results of unchanged rows (skip_unchanged), see incremental.py
    num_carried: NotRequired[int]


class SubmittedBatch(ChunkDescriptor):
    """A chunk after SubmitBatchOperator created its provider batch."""

    batch_id: str
    input_file_id: NotRequired[str | None]
    idempotency_key: NotRequired[str]  # the batch's key at the provider: the sensor cancels other batches with it
    adopted_unproven: NotRequired[bool]  # adopted on a guess: the sensor checks it is the chunk's own when it ends
    key_since: NotRequired[float | None]  # epoch s: no batch with the key is older (how far back to look for one)


class CompletedBatch(SubmittedBatch):
    """A submitted chunk whose batch reached a terminal status (BatchCompleteSensor's output)."""

    state: dict[str, Any] | None  # the first attempt's BatchState.to_dict(); None for an empty chunk
    attempts: NotRequired[list[dict[str, Any]]]  # every attempt's state (line retries), oldest first


class ResultRecord(TypedDict):
    """One parsed result line, normalised across providers."""

    custom_id: str
    status: ResultStatus
    response: Any  # str for chat/completions, list[float] for embeddings, None on error
    finish_reason: str | None
    error: str | None
    error_code: str | None
    http_status: int | None
    input_tokens: int | None  # every input token, cached ones included
    output_tokens: int | None
    cached_input_tokens: NotRequired[int | None]  # of input_tokens: read from the prompt cache (None: not reported)
    cache_write_tokens: NotRequired[int | None]  # of input_tokens: written to the prompt cache


Given = TypeVar("Given")


def descriptor_argument(value: Given, *, task_id: str, argument: str, operator: str) -> Given:
    """Return ``value``, a descriptor handed to one task; refuse anything else at DAG parse time.

    Descriptors arrive one per mapped task through ``.expand()``. They are not template fields (a
    rendered copy of each would be stored per task instance, ~1.4 KB per chunk), so Airflow would
    neither resolve an XCom reference given to the constructor nor make the task wait for its source.
    """
    if isinstance(value, Mapping):
        return value
    what = "an XCom reference" if hasattr(value, "resolve") else type(value).__name__
    raise TypeError(
        f"{task_id}: {argument} takes one descriptor (a dict), got {what}; map over the upstream task's "
        f"list: {operator}.partial(task_id={task_id!r}, ...).expand({argument}=<upstream>.output)"
    )
