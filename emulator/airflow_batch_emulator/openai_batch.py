"""The OpenAI batch lifecycle: validate the input file, run lines in slices, write output/error files.

validating → in_progress → finalizing → completed, one ``latency`` apart; ``failed`` from
validating; ``expired`` from in_progress when any line expired; cancelling → cancelled keeps
the lines processed so far. The heavy per-line work runs outside the store lock. Under the
``polls_before_done`` fault a batch that would complete (or expire) is held in ``finalizing``
(or ``in_progress``) until its status has been retrieved that many times (:meth:`OpenAIRunner.polled`).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from airflow_batch_emulator.faults import Faults, cut_short, line_fate
from airflow_batch_emulator.prompt_cache import PromptCache, best_effort_miss, openai_cached_tokens
from airflow_batch_emulator.records import OpenAIBatch
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import (
    OPENAI_BUILDERS,
    ParamError,
    cut_openai_answer,
    messages_text,
    prompt_tokens,
    request_tokens,
    unique_id,
)

# Endpoints whose answers a max_tokens limit can cut off (truncate_rate).
CUTTABLE_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})

MAX_LINES = 50_000
MAX_INPUT_BYTES = 200 * 1024 * 1024
MAX_REPORTED_ERRORS = 1000
REQUIRED_KEYS = ("custom_id", "method", "url", "body")


@dataclass
class Validation:
    """What validating an input file found."""

    lines: list[bytes] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    tokens: int = 0


def _error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}


def engine_endpoint(endpoint: str) -> str:
    """Return the OpenAI route that answers ``endpoint`` (Azure names ``/chat/completions`` without ``/v1``)."""
    return endpoint if endpoint.startswith("/v1/") else "/v1" + endpoint


def validate_input(data: bytes, endpoint: str, faults: Faults, max_lines: int = MAX_LINES) -> Validation:
    """Check an input file the way the Batch API does; collect every error found."""
    result = Validation()
    lines = _file_lines(data, faults, result.errors, max_lines)
    if lines is None:
        return result
    seen: set[str] = set()
    errors = result.errors
    first_model: str | None = None
    for number, raw in enumerate(lines, 1):
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
        body = _check_line(raw, number, endpoint, seen, errors)
        if body is None:
            continue
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str):
            if first_model is None:
                first_model = model
            elif model != first_model and not any(e["code"] == "model_mismatch" for e in errors):
                msg = f"The model {model!r} differs from {first_model!r}; all requests in a batch must use one model."
                errors.append(_error("model_mismatch", msg, number, "body.model"))
        if faults.token_limit is not None:
            result.tokens += request_tokens(engine_endpoint(endpoint), body)
    result.lines = lines
    result.model = first_model
    return result


def _file_lines(data: bytes, faults: Faults, errors: list[dict[str, Any]], max_lines: int) -> list[bytes] | None:
    """Return the file's lines, or None after recording why the whole file is refused."""
    if faults.fail_validation:
        errors.append(
            _error(faults.fail_validation, "Validation failed on purpose (emulator fault fail_validation).", None)
        )
        return None
    if len(data) > MAX_INPUT_BYTES:
        errors.append(_error("file_too_large", f"The input file is {len(data)} bytes; the limit is 200 MB."))
        return None
    lines = data.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        msg = "The batch input file is empty. Please ensure that the batch contains at least one request."
        errors.append(_error("empty_file", msg))
        return None
    if len(lines) > max_lines:
        msg = f"The batch input file contains {len(lines)} requests; the maximum is {max_lines}."
        errors.append(_error("too_many_tasks", msg))
        return None
    return lines


def _check_line(raw: bytes, number: int, endpoint: str, seen: set[str], errors: list[dict[str, Any]]) -> Any:
    """Record the line's errors; return its body, or None when the line is unusable."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        errors.append(_error("invalid_json_line", "This line is not parseable as valid JSON.", number))
        return None
    missing = [key for key in REQUIRED_KEYS if obj.get(key) in (None, "")]
    if missing:
        msg = f"Missing required parameter: '{missing[0]}'."
        errors.append(_error("missing_required_parameter", msg, number, missing[0]))
        return None
    custom_id = str(obj["custom_id"])
    if custom_id in seen:
        msg = f"The custom_id {custom_id!r} is a duplicate of another request; custom_id must be unique."
        errors.append(_error("duplicate_custom_id", msg, number, "custom_id"))
    seen.add(custom_id)
    if obj["url"] != endpoint:
        msg = f"The URL {obj['url']!r} of this request does not match the batch endpoint ({endpoint})."
        errors.append(_error("url_mismatch", msg, number, "url"))
    return obj["body"]


def run_line(
    batch_id: str,
    endpoint: str,
    raw: bytes,
    faults: Faults,
    created: int,
    cache: PromptCache | None = None,
    line: int = 0,
) -> tuple[str, bytes, int, int]:
    """Execute one validated line (the batch's 0-based ``line``); return (outcome, JSONL record, input, output tokens).

    With a ``cache``, a chat request's long prefix is read from it as OpenAI's automatic cache would.

    The outcome is ``ok``, ``error`` (goes to the error file) or ``expired``.
    """
    obj = orjson.loads(raw)
    custom_id = str(obj["custom_id"])
    digest = hashlib.blake2b(f"{batch_id}:{custom_id}".encode(), digest_size=16).hexdigest()
    record: dict[str, Any] = {"id": "batch_req_" + digest, "custom_id": custom_id, "response": None, "error": None}
    fate = line_fate(faults, custom_id, batch_id)
    if fate == "expired":
        msg = "This request could not be executed before the completion window expired."
        record["error"] = {"code": "batch_expired", "message": msg}
        return "expired", orjson.dumps(record), 0, 0
    status, body = 200, None
    if fate == "server_error":
        status, body = 500, _error_body("The server had an error processing your request (emulated).", "server_error")
    elif fate == "invalid":
        status, body = 400, _error_body("Invalid request (emulator fault invalid_line_rate).", "invalid_request_error")
    else:
        try:
            body = OPENAI_BUILDERS[engine_endpoint(endpoint)](obj["body"], created)
            unique_id(body, digest)
            if cache is not None and engine_endpoint(endpoint) == "/v1/chat/completions":
                _read_cache(cache, obj["body"], body, best_effort_miss(faults.cache_miss_rate, line))
            if engine_endpoint(endpoint) in CUTTABLE_ENDPOINTS and cut_short(faults, custom_id):
                cut_openai_answer(body)
        except ParamError as exc:
            status, body = 400, _error_body(exc.message, "invalid_request_error", exc.param)
        except (AttributeError, TypeError, ValueError) as exc:
            status, body = 400, _error_body(f"Invalid request body: {exc}", "invalid_request_error")
    record["response"] = {"status_code": status, "request_id": "req_" + digest[::-1], "body": body}
    usage: dict[str, Any] = (body.get("usage") or {}) if status == 200 and body is not None else {}
    in_tokens = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    out_tokens = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return ("ok" if status == 200 else "error"), orjson.dumps(record), in_tokens, out_tokens


def _read_cache(cache: PromptCache, request: dict[str, Any], answer: dict[str, Any], force_miss: bool) -> None:
    """Set ``cached_tokens`` in the answer's usage: the prefix (every message but the last) when cached."""
    prefix = prompt_tokens(messages_text((request.get("messages") or [])[:-1]))  # as prompt_tokens counts them
    answer["usage"]["prompt_tokens_details"]["cached_tokens"] = openai_cached_tokens(cache, request, prefix, force_miss)


def _error_body(message: str, type_: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": None}}


def jsonl(lines: list[bytes], seed: str) -> bytes:
    """Join records into a ``\\n``-terminated JSONL blob in a deterministic shuffled order."""
    ordered = list(lines)
    random.Random(seed).shuffle(ordered)
    return b"".join(line + b"\n" for line in ordered)


class OpenAIRunner:
    """Advances OpenAI batches; called by the worker thread."""

    def __init__(self, store: Store, latency: float, slice_size: int) -> None:
        self.store = store
        self.latency = latency
        self.slice_size = slice_size
        self.cache = PromptCache()  # OpenAI's automatic prompt cache, shared by this emulator's batches

    def step(self, batch: OpenAIBatch, now: float) -> float | None:
        """Do the next piece of work for ``batch``; return seconds until it wants the next step."""
        if batch.held is not None:  # finished; a status retrieve ends it (see ``conclude``)
            return None
        status = batch.status
        if status in ("validating", "finalizing", "cancelling") and now < batch.due:
            return batch.due - now
        if status == "validating":
            self._validate(batch)
            return 0.0
        if status == "in_progress":
            return self._progress(batch, now)
        if status == "finalizing":
            self.conclude(batch, "completed")
        elif status == "cancelling":
            self._finish(batch, "cancelled")
        return None

    def _live(self, batch: OpenAIBatch) -> bool:
        return self.store.openai_batches.get(batch.id) is batch

    def _validate(self, batch: OpenAIBatch) -> None:
        stored = self.store.files.get(batch.input_file_id)
        data = stored.data if stored is not None else b""
        found = validate_input(data, batch.endpoint, batch.faults, batch.max_lines)
        with self.store.lock:
            if not self._live(batch) or batch.status != "validating":
                return
            batch.model = found.model
            wall = time.time()
            if not found.errors and batch.faults.token_limit is not None:
                queued = sum(
                    other.enqueued_tokens
                    for other in self.store.openai_batches.values()
                    if other.model == found.model and other.status in ("in_progress", "finalizing")
                )
                if queued + found.tokens > batch.faults.token_limit:
                    msg = (
                        f"Enqueued token limit reached for {found.model}: limit {batch.faults.token_limit}, "
                        f"already enqueued {queued}, this batch {found.tokens}. Try again once batches complete."
                    )
                    found.errors.append(_error("token_limit_exceeded", msg))
            if found.errors:
                batch.errors = found.errors
                batch.set_status("failed", wall)
                return
            batch.lines = found.lines
            batch.total = len(found.lines)
            batch.enqueued_tokens = found.tokens
            if batch.faults.cancel_batches:
                batch.cancel_at_line = batch.total // 2
            batch.set_status("in_progress", wall)
            batch.phase_start = time.monotonic()  # not ``now``: validating a big file takes a while

    def _pace(self, batch: OpenAIBatch) -> float:
        return self.latency + batch.faults.slow

    def _progress(self, batch: OpenAIBatch, now: float) -> float | None:
        pace = self._pace(batch)
        total = batch.total
        with self.store.lock:
            if batch.status != "in_progress":
                return 0.0
            start = batch.cursor
            target = total if pace <= 0 else min(total, math.ceil(total * (now - batch.phase_start) / pace))
            stop = min(target, start + self.slice_size)
            if batch.cancel_at_line is not None:
                stop = min(stop, batch.cancel_at_line)
        records = []
        created = int(time.time())
        for line, raw in enumerate(batch.lines[start:stop], start):
            records.append(run_line(batch.id, batch.endpoint, raw, batch.faults, created, self.cache, line))
        with self.store.lock:
            if not self._live(batch):
                return None
            self._commit(batch, records, stop)
            if batch.status != "in_progress":
                return 0.0
            if batch.cancel_at_line is not None and batch.cursor >= batch.cancel_at_line:
                self.cancel(batch, now, provider_side=True)
                return 0.0
            if batch.cursor < total:
                return max(0.0, batch.phase_start + pace * (batch.cursor + 1) / total - now)
            if now < batch.phase_start + pace:
                return batch.phase_start + pace - now
            if batch.expired:
                self.conclude(batch, "expired")
                return None
            batch.set_status("finalizing", time.time())
            batch.due = now + self.latency
            return self.latency

    def _commit(self, batch: OpenAIBatch, records: list[tuple[str, bytes, int, int]], stop: int) -> None:
        counters = self.store.counters["openai"]
        for outcome, line, in_tokens, out_tokens in records:
            if outcome == "ok":
                batch.out.append(line)
                batch.completed += 1
                counters["requests_succeeded"] += 1
            elif outcome == "error":
                batch.err.append(line)
                batch.failed += 1
                counters["requests_failed"] += 1
            else:
                batch.err.append(line)
                batch.expired += 1
                counters["requests_expired"] += 1
            batch.input_tokens += in_tokens
            batch.output_tokens += out_tokens
        counters["requests_processed"] += len(records)
        batch.cursor = max(batch.cursor, stop)

    def conclude(self, batch: OpenAIBatch, final: str) -> None:
        """Enter ``final`` (``completed``/``expired``) now, or hold it for ``polls_before_done``.

        A held batch keeps its status (``finalizing``/``in_progress``) and ``held`` names where it
        goes; the status retrieve that makes ``polls`` reach ``polls_before_done`` ends it.
        """
        with self.store.lock:
            if not self._live(batch) or batch.status not in ("in_progress", "finalizing"):
                return  # cancelled meanwhile: the worker ends it as cancelled
            if batch.polls < batch.faults.polls_before_done:
                batch.held = final
                self.store.counters["openai"]["batches_held_for_polls"] += 1
                return
        self._finish(batch, final)

    def polled(self, batch: OpenAIBatch) -> None:
        """Count one status retrieve of ``batch``; end a held batch once there were enough."""
        with self.store.lock:
            batch.polls += 1
            final = batch.held
            if not final or batch.polls < batch.faults.polls_before_done:
                return
            batch.held = ""  # claimed: not None keeps the worker off, "" keeps other retrieves off
        self._finish(batch, final)

    def cancel(self, batch: OpenAIBatch, now: float, provider_side: bool = False) -> None:
        """Start cancelling (caller holds the lock); the worker ends it one latency later."""
        if batch.status not in ("validating", "in_progress", "finalizing"):
            return
        if batch.held:  # a held batch is still in progress for its clients: cancel it like one
            batch.held = None
        batch.set_status("cancelling", time.time())
        batch.due = now + self.latency
        self.store.counters["openai"]["batches_cancelled"] += 1
        if provider_side:
            self.store.counters["openai"]["batches_cancelled_by_provider"] += 1
        self.store.wakeup.set()

    def _finish(self, batch: OpenAIBatch, final: str) -> None:
        """Write the output/error files and enter ``final``."""
        with self.store.lock:
            if not self._live(batch):
                return
            out, err = batch.out, batch.err
            batch.out, batch.err, batch.lines = [], [], []
        out_blob = jsonl(out, batch.id) if out else None
        err_blob = jsonl(err, batch.id + ":errors") if err else None
        expires = batch.output_expires_after
        with self.store.lock:
            if not self._live(batch):
                return
            if out_blob is not None:
                name = f"batch_{batch.id}_output.jsonl"
                batch.output_file_id = self.store.add_file(name, "batch_output", out_blob, expires).id
            if err_blob is not None:
                name = f"batch_{batch.id}_error.jsonl"
                batch.error_file_id = self.store.add_file(name, "batch_output", err_blob, expires).id
            batch.held = None
            batch.set_status(final, time.time())
