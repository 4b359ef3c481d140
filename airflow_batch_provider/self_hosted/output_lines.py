"""Result files of self-hosted generation (vLLM offline, OpenAI-compatible servers): lines, files, sidecars.

VLLMGenerateOperator and ServerGenerateOperator answer a chunk themselves instead of handing it
to a provider's batch API. They write the answers in the **OpenAI batch output format** — one
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` line per
request — to ``job_dir/results/chunk-NNNNN.output.jsonl`` and describe the file with a
:class:`~airflow_batch_provider.status.BatchState` whose ``output_file_id`` is the file's path.
MergeResultsOperator then reads it through :class:`~airflow_batch_provider.hooks.local_results.LocalResultsHook`
exactly as it reads an OpenAI output file.

Next to each output file a small ``chunk-NNNNN.output.meta.json`` sidecar records the chunk
fingerprint, the provider and the request count. It is written after the output file (both
through a temporary name), so "sidecar matches and the output has one line per request" means
the chunk is done: a retry skips it instead of generating again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.job_folder import JobFolder, results_meta
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.utils.storage import atomic_write, to_path

META_VERSION = 1


# ------------------------------------------------------------------------------------ file layout


def results_path(chunk: Mapping[str, Any], output_dir: str | None = None) -> str:
    """Return the output file of ``chunk``: ``<output_dir or job_dir/results>/chunk-NNNNN.output.jsonl``."""
    return str(JobFolder(chunk["job_dir"]).results(chunk["chunk_index"], output_dir))


def meta_path(output_path: str) -> str:
    """Return the sidecar path of an output file (``….output.jsonl`` → ``….output.meta.json``)."""
    return results_meta(output_path)


def iter_lines(path: str) -> Iterator[bytes]:
    """Stream the non-blank lines of a local or object-storage file."""
    with to_path(path).open("rb") as handle:
        for line in handle:
            if line.strip():
                yield line.rstrip(b"\r\n")


def count_lines(path: str) -> int:
    """Return the number of non-blank lines of a file (0 when it does not exist)."""
    if not to_path(path).exists():
        return 0
    return sum(1 for _ in iter_lines(path))


@dataclass(frozen=True)
class ChunkRequest:
    """One line of a chunk's requests file (OpenAI batch input format)."""

    index: int
    custom_id: str
    url: str
    body: dict[str, Any]


def iter_requests(chunk: Mapping[str, Any]) -> Iterator[ChunkRequest]:
    """Stream the chunk's request lines; raise InvalidInputError naming the chunk and line when one is unreadable."""
    for index, raw in enumerate(iter_lines(chunk["requests_path"])):
        try:
            obj = orjson.loads(raw)
            request = ChunkRequest(index, str(obj["custom_id"]), str(obj.get("url") or chunk["endpoint"]), obj["body"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidInputError(
                f"{chunk['label']}: line {index + 1} of {chunk['requests_path']} is not an OpenAI batch request "
                f"line ({type(exc).__name__}: {exc}); rebuild the chunk with ChunkOperator."
            ) from exc
        if not isinstance(request.body, dict):
            raise InvalidInputError(
                f"{chunk['label']}: line {index + 1} of {chunk['requests_path']} has no body object."
            )
        yield request


# ----------------------------------------------------------------------------------- line format


def request_id(fingerprint: str, index: int) -> str:
    """Return a deterministic request id for line ``index`` of a chunk (reruns write identical files)."""
    return f"req_{fingerprint[:16]}_{index:06d}"


def _line_id(custom_id: str, fingerprint: str) -> str:
    digest = hashlib.blake2b(f"{fingerprint}\x1f{custom_id}".encode(), digest_size=12).hexdigest()
    return f"batch_req_{digest}"


def success_line(custom_id: str, body: Mapping[str, Any], *, fingerprint: str, req_id: str) -> bytes:
    """Return one OpenAI batch output line for a request answered with HTTP 200."""
    return orjson.dumps(
        {
            "id": _line_id(custom_id, fingerprint),
            "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": req_id, "body": body},
            "error": None,
        }
    )


def error_line(
    custom_id: str,
    *,
    fingerprint: str,
    req_id: str,
    message: str,
    status_code: int | None,
    code: str | None = None,
) -> bytes:
    """Return one OpenAI batch output line for a failed request.

    With an HTTP status the error sits in the response body, as OpenAI writes request errors;
    without one (connection lost, engine refused the request before any HTTP exchange) it goes
    in the line's ``error`` object.
    """
    line: dict[str, Any] = {"id": _line_id(custom_id, fingerprint), "custom_id": custom_id}
    if status_code is None:
        line["response"] = None
        line["error"] = {"code": code or "request_failed", "message": message}
    else:
        error = {"message": message, "type": code or "server_error", "param": None, "code": code}
        line["response"] = {"status_code": status_code, "request_id": req_id, "body": {"error": error}}
        line["error"] = None
    return orjson.dumps(line)


def chat_completion_body(
    *,
    completion_id: str,
    model: str,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    created: int | None = None,
) -> dict[str, Any]:
    """Return a ``chat.completion`` response body with one choice and its usage."""
    return {
        "id": f"chatcmpl-{completion_id}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def text_completion_body(
    *, completion_id: str, model: str, text: str, finish_reason: str | None, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """Return a legacy ``text_completion`` (``/v1/completions``) response body with one choice and its usage."""
    return {
        "id": f"cmpl-{completion_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason or "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def embedding_body(*, model: str, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
    """Return an embeddings ``list`` response body (float vectors, in input order)."""
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


# ----------------------------------------------------------------------------------- completeness


@dataclass
class ResultCounts:
    """How many lines of an output file succeeded and failed."""

    total: int = 0
    succeeded: int = 0
    failed: int = 0

    def add(self, ok: bool) -> None:
        """Count one line."""
        self.total += 1
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1


def load_complete(chunk: Mapping[str, Any], provider: str, output_path: str) -> dict[str, Any] | None:
    """Return the sidecar record when ``output_path`` already holds this chunk's complete result, else None.

    Complete means: the sidecar names the same chunk fingerprint, provider and request count,
    and the output file has exactly one line per request.
    """
    sidecar = to_path(meta_path(output_path))
    if not sidecar.exists():
        return None
    try:
        record = orjson.loads(sidecar.read_bytes())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    same = (
        record.get("fingerprint") == chunk["fingerprint"]
        and record.get("provider") == provider
        and record.get("num_requests") == chunk["num_requests"]
    )
    if not same or count_lines(output_path) != chunk["num_requests"]:
        return None
    return record


def write_meta(output_path: str, record: Mapping[str, Any]) -> None:
    """Write the sidecar of ``output_path`` through a temporary name."""
    with atomic_write(meta_path(output_path)) as out:
        out.write(orjson.dumps({"version": META_VERSION, **record}, option=orjson.OPT_INDENT_2))


def completed_batch(
    chunk: Mapping[str, Any],
    *,
    provider: str,
    output_path: str,
    counts: ResultCounts,
    generation: Mapping[str, Any],
) -> dict[str, Any]:
    """Return the CompletedBatch-shaped dict (plus ``generation`` stats) MergeResultsOperator takes.

    ``provider`` is ``"vllm"`` or ``"server"``; the batch id is ``<provider>-<fingerprint[:16]>``.
    """
    batch_id = f"{provider}-{chunk['fingerprint'][:16]}"
    state = BatchState(
        batch_id=batch_id,
        provider=provider,
        status=BatchStatus.COMPLETED,
        provider_status="completed",
        counts=RequestCounts(total=counts.total, completed=counts.succeeded, failed=counts.failed),
        output_file_id=output_path,
    )
    return {
        **chunk,
        "provider": provider,
        "batch_id": batch_id,
        "input_file_id": None,
        "state": state.to_dict(),
        "generation": dict(generation),
    }
