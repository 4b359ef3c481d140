"""Gemini Developer API batch jobs in the emulator: stored files, jobs, answers and the job worker.

PENDING → RUNNING → SUCCEEDED, or FAILED (``fail_validation``, an unreadable input file), or
CANCELLED (a cancel; ``cancel_batches`` cancels halfway on the provider's side), or EXPIRED. The
wire speaks ``BATCH_STATE_*`` (the SDK shows them as ``JOB_STATE_*``). Results go to a generated
file of ``{"key", "response"}`` / ``{"key", "error"}`` lines in input order.

Line faults as for the other APIs: ``line_error_rate`` → an ``INTERNAL`` (500) error line,
``invalid_line_rate`` → ``INVALID_ARGUMENT`` (400), ``truncate_rate`` → ``MAX_TOKENS`` answers cut
short. Gemini has no per-line expiry: a line fated to expire (``expire_rate``) gets no result and
ends its whole job ``EXPIRED``, as a job still running after 48 hours does. ``slow`` and
``polls_before_done`` work as for the other batches.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from airflow_batch_emulator.faults import Faults, cut_short, line_fate
from airflow_batch_emulator.records import rfc3339
from airflow_batch_emulator.schema import schema_instance
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import (
    ParamError,
    answer_text,
    cut_text,
    estimate_tokens,
    request_key,
    rng_for,
    truncate,
)

log = logging.getLogger("airflow_batch_emulator")

TERMINAL = frozenset({"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED"})
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"


@dataclass
class GeminiFile:
    """A File API object: uploaded (input) or generated (a batch's results)."""

    name: str
    display_name: str
    mime_type: str
    data: bytes
    created: float
    source: str = "UPLOADED"

    def to_json(self, base_url: str) -> dict[str, Any]:
        """Return the ``File`` resource as the API writes it (int64 as a string, RFC 3339 times)."""
        body: dict[str, Any] = {
            "name": self.name,
            "displayName": self.display_name,
            "mimeType": self.mime_type,
            "sizeBytes": str(len(self.data)),
            "createTime": rfc3339(self.created),
            "updateTime": rfc3339(self.created),
            "expirationTime": rfc3339(self.created + 48 * 3600),
            "state": "ACTIVE",
            "source": self.source,
            "uri": f"{base_url}/v1beta/{self.name}",
        }
        if self.source == "GENERATED":
            body["downloadUri"] = f"{base_url}/v1beta/{self.name}:download?alt=media"
        return body


@dataclass
class GeminiJob:
    """One batch job and what the worker knows about it."""

    name: str
    model: str
    display_name: str
    input_file: str
    faults: Faults
    created: float = field(default_factory=time.time)
    state: str = "BATCH_STATE_PENDING"
    updated: float = field(default_factory=time.time)
    ended: float | None = None
    error: dict[str, Any] | None = None
    responses_file: str | None = None
    lines: list[tuple[str, Any]] = field(default_factory=list)
    results: list[bytes] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0, "expired": 0})
    cursor: int = 0
    due: float = 0.0
    polls: int = 0
    held: str | None = None  # a finished job waiting for polls_before_done: the state it will show
    cancel_requested: bool = False

    def set_state(self, state: str) -> None:
        """Move to ``state`` and log the change."""
        log.info("gemini batch %s: %s -> %s", self.name, self.state, state)
        self.state = state
        self.updated = time.time()
        if state in TERMINAL:
            self.ended = self.updated

    def to_json(self) -> dict[str, Any]:
        """Return the batch as the API's long-running ``Operation`` (the batch in ``metadata``)."""
        shown = self.state
        total = len(self.lines)
        done = self.counts["ok"] + self.counts["failed"]
        metadata: dict[str, Any] = {
            "@type": BATCH_TYPE,
            "name": self.name,
            "model": self.model,
            "displayName": self.display_name,
            "inputConfig": {"fileName": self.input_file},
            "createTime": rfc3339(self.created),
            "updateTime": rfc3339(self.updated),
            "state": shown,
            "batchStats": {
                "requestCount": str(total),
                "successfulRequestCount": str(self.counts["ok"]),
                "failedRequestCount": str(self.counts["failed"]),
                "pendingRequestCount": str(max(0, total - done)),
            },
        }
        operation: dict[str, Any] = {"name": self.name, "metadata": metadata, "done": shown in TERMINAL}
        if shown in TERMINAL:
            metadata["endTime"] = rfc3339(self.ended)
        if shown in TERMINAL and self.responses_file:
            metadata["output"] = {"responsesFile": self.responses_file}
            operation["response"] = {"@type": OUTPUT_TYPE, "responsesFile": self.responses_file}
        if self.error is not None:
            operation["error"] = self.error
        return operation


def _texts(content: Any) -> list[str]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p["text"] for p in parts or () if isinstance(p, dict) and isinstance(p.get("text"), str)]


def _openapi_to_json_schema(schema: Any) -> Any:
    """Lower-case the OpenAPI ``type`` names of a ``responseSchema`` (``STRING`` → ``string``), recursively."""
    if isinstance(schema, list):
        return [_openapi_to_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _openapi_to_json_schema(value) for key, value in schema.items()}
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
    return out


def generate_content(request: Any, model: str) -> dict[str, Any]:
    """Answer one ``GenerateContentRequest``; raise ``ParamError`` for what the API would reject."""
    if not isinstance(request, dict):
        raise ParamError("request: must be a GenerateContentRequest object")
    contents = request.get("contents")
    if not isinstance(contents, list) or not contents:
        raise ParamError("contents: is required and must be a non-empty list")
    system = request.get("systemInstruction")
    config = request.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise ParamError("generationConfig: must be an object")
    key = request_key(model.encode(), orjson.dumps(system), orjson.dumps(contents, option=orjson.OPT_SORT_KEYS))
    texts = _texts(system) + [text for content in contents for text in _texts(content)]
    schema = config.get("responseJsonSchema")
    if schema is None and config.get("responseSchema") is not None:
        schema = _openapi_to_json_schema(config["responseSchema"])
    if schema is not None and config.get("responseMimeType") != "application/json":
        raise ParamError("generationConfig.responseMimeType: must be application/json with a response schema")
    if schema is not None:
        text = orjson.dumps(schema_instance(schema, rng_for(key))).decode()
    else:
        text = answer_text(key, "\n".join(texts))
    text, output_tokens, cut = truncate(text, config.get("maxOutputTokens"))
    prompt = sum(estimate_tokens(t) for t in texts)
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": "MAX_TOKENS" if cut else "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": prompt,
            "candidatesTokenCount": output_tokens,
            "totalTokenCount": prompt + output_tokens,
        },
        "modelVersion": model.removeprefix("models/"),
        "responseId": key.hex()[:24],
    }


def _error_line(key: str, code: int, status: str, message: str) -> bytes:
    return orjson.dumps({"key": key, "error": {"code": code, "message": message, "status": status}})


def run_line(job: GeminiJob, key: str, request: Any) -> tuple[str, bytes | None]:
    """Answer one line of ``job``; return (outcome ``ok``/``failed``/``expired``, result line or None)."""
    fate = line_fate(job.faults, key, job.name)
    if fate == "expired":
        return "expired", None
    if fate == "server_error":
        return "failed", _error_line(key, 500, "INTERNAL", "Internal error (emulator fault line_error_rate).")
    if fate == "invalid":
        return "failed", _error_line(
            key, 400, "INVALID_ARGUMENT", "Invalid request (emulator fault invalid_line_rate)."
        )
    try:
        answer = generate_content(request, job.model)
    except ParamError as exc:
        return "failed", _error_line(key, 400, "INVALID_ARGUMENT", exc.message)
    if cut_short(job.faults, key):
        candidate = answer["candidates"][0]
        part = candidate["content"]["parts"][0]
        part["text"] = cut_text(part["text"])
        candidate["finishReason"] = "MAX_TOKENS"
    return "ok", orjson.dumps({"key": key, "response": answer})


def parse_input(data: bytes) -> list[tuple[str, Any]]:
    """Read an input file's ``{"key", "request"}`` lines; raise ValueError naming the first bad line."""
    lines: list[tuple[str, Any]] = []
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"line {number} of the input file is not valid JSON: {exc}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("key"), str) or "request" not in obj:
            raise ValueError(f"line {number} of the input file must be an object with 'key' and 'request'")
        lines.append((obj["key"], obj["request"]))
    if not lines:
        raise ValueError("the input file holds no requests")
    return lines


class GeminiRunner:
    """Owns the jobs and a worker thread that advances them."""

    def __init__(self, store: Store, files: dict[str, GeminiFile], latency: float, slice_size: int) -> None:
        self.store = store
        self.files = files
        self.latency = latency
        self.slice_size = slice_size
        self.jobs: dict[str, GeminiJob] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker thread (idempotent) and wake it."""
        with self.store.lock:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="gemini-batches", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """Stop the worker thread."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.store.lock:
                live = [job for job in self.jobs.values() if job.state not in TERMINAL and job.held is None]
            wait = 0.5
            for job in live:
                try:
                    wait = min(wait, self._step(job, time.monotonic()))
                except Exception:
                    log.exception("gemini batch %s: emulator error; failing the job", job.name)
                    with self.store.lock:
                        job.error = {"code": 13, "message": "Internal error in the emulator."}
                        job.set_state("BATCH_STATE_FAILED")
            self._wake.wait(max(0.01, wait))
            self._wake.clear()

    def _step(self, job: GeminiJob, now: float) -> float:
        if job.cancel_requested:
            self._finish(job, "BATCH_STATE_CANCELLED")
            return 0.0
        if now < job.due:
            return job.due - now
        if job.state == "BATCH_STATE_PENDING":
            self._validate(job, now)
            return max(0.0, job.due - now)
        return self._progress(job)

    def _validate(self, job: GeminiJob, now: float) -> None:
        try:
            if job.faults.fail_validation:
                raise ValueError(f"{job.faults.fail_validation}: the input failed validation (emulator fault).")
            stored = self.files.get(job.input_file)
            if stored is None:
                raise ValueError(f"input file {job.input_file} does not exist")
            lines = parse_input(stored.data)
        except ValueError as exc:
            with self.store.lock:
                job.error = {"code": 3, "message": str(exc)}
                job.set_state("BATCH_STATE_FAILED")
            self.store.bump("gemini", "batches_failed")
            return
        with self.store.lock:
            job.lines = lines
            job.set_state("BATCH_STATE_RUNNING")
            job.due = now + self.latency + job.faults.slow

    def _progress(self, job: GeminiJob) -> float:
        stop = min(len(job.lines), job.cursor + self.slice_size)
        half = max(1, len(job.lines) // 2)
        if job.faults.cancel_batches:
            stop = min(stop, half)
        done = [run_line(job, key, request) for key, request in job.lines[job.cursor : stop]]
        with self.store.lock:
            for outcome, line in done:
                job.counts[outcome] += 1
                if line is not None:
                    job.results.append(line)
            job.cursor = stop
            job.updated = time.time()
            self.store.counters["gemini"]["requests_processed"] += len(done)
        if job.faults.cancel_batches and job.cursor >= half:
            self.store.bump("gemini", "batches_cancelled_by_provider")
            self._finish(job, "BATCH_STATE_CANCELLED")
            return 0.0
        if job.cursor < len(job.lines):
            return 0.0
        final = "BATCH_STATE_EXPIRED" if job.counts["expired"] else "BATCH_STATE_SUCCEEDED"
        if job.polls < job.faults.polls_before_done:
            with self.store.lock:
                job.held = final
            self.store.bump("gemini", "batches_held_for_polls")
            return 0.5
        self._finish(job, final)
        return 0.0

    def _finish(self, job: GeminiJob, state: str) -> None:
        """Write the results file (when any line ran) and end the job in ``state``."""
        with self.store.lock:
            if job.state in TERMINAL:
                return
            if job.results:
                name = f"files/{job.name.removeprefix('batches/')}-results"
                blob = b"".join(line + b"\n" for line in job.results)
                label = f"{job.name} results"
                self.files[name] = GeminiFile(name, label, "application/jsonl", blob, time.time(), "GENERATED")
                job.responses_file = name
            job.held = None
            job.set_state(state)
        self.store.bump("gemini", f"batches_{state.removeprefix('BATCH_STATE_').lower()}")

    def polled(self, job: GeminiJob) -> None:
        """Count one status retrieve; end a held job once it was retrieved often enough."""
        with self.store.lock:
            job.polls += 1
            held = job.held
            if held is None or job.polls < job.faults.polls_before_done:
                return
        self._finish(job, held)

    def cancel(self, job: GeminiJob) -> None:
        """Ask to cancel a job: the worker ends it ``CANCELLED`` at its next step (a finished one stays as it is)."""
        with self.store.lock:
            if job.state in TERMINAL:
                return
            job.held = None  # a held job is still running for its clients: cancel it like one
            job.cancel_requested = True
            self.store.counters["gemini"]["batches_cancel_requested"] += 1
        self._wake.set()
