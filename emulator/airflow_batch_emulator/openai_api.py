"""OpenAI routes under ``/v1``: files, batches, and the realtime (non-batch) model endpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.faults import cut_short_realtime
from airflow_batch_emulator.openai_batch import CUTTABLE_ENDPOINTS, MAX_LINES, OpenAIRunner
from airflow_batch_emulator.records import OpenAIBatch, StoredFile
from airflow_batch_emulator.scheduling import request_priority
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import OPENAI_BUILDERS, ParamError, cut_openai_answer, unique_id
from airflow_batch_emulator.wire import (
    OpenAIError,
    Request,
    Response,
    json_response,
    openai_error,
)

log = logging.getLogger("airflow_batch_emulator")

Handler = Callable[[Request], Response]

BATCH_ENDPOINTS = frozenset(OPENAI_BUILDERS)
FILE_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
DEFAULT_FILE_TTL = 30 * 24 * 3600
NO_RETRY = {"x-should-retry": "false"}


def _missing(param: str) -> OpenAIError:
    return OpenAIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def _invalid(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")


def _page(items: list[Any], after: str | None, limit: int) -> dict[str, Any]:
    """Cut a newest-first list into an OpenAI cursor page after the item with id ``after``."""
    start = 0
    if after:
        ids = [item["id"] for item in items]
        start = ids.index(after) + 1 if after in ids else len(items)
    data = items[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "has_more": start + limit < len(items),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def _limit(query: dict[str, str], default: int, maximum: int) -> int:
    raw = query.get("limit")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise _invalid("limit", f"Invalid 'limit': {raw!r} is not an integer.") from None
    if not 1 <= value <= maximum:
        raise _invalid("limit", f"Invalid 'limit': {value}; it must be between 1 and {maximum}.")
    return value


def check_metadata(metadata: Any) -> dict[str, str] | None:
    """Reject metadata with more than 16 pairs, keys over 64 or values over 512 characters."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise _invalid("metadata", "Invalid 'metadata': expected an object of string pairs.")
    if len(metadata) > 16:
        raise _invalid("metadata", f"Invalid 'metadata': {len(metadata)} pairs; at most 16 are allowed.")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _invalid("metadata", f"Invalid 'metadata': value of {key!r} must be a string.")
        if len(key) > 64:
            raise _invalid("metadata", f"Invalid 'metadata': key {key[:20]!r}… is longer than 64 characters.")
        if len(value) > 512:
            raise _invalid("metadata", f"Invalid 'metadata': value of {key!r} is longer than 512 characters.")
    return dict(metadata)


def _expiry_seconds(anchor: Any, seconds: Any, param: str) -> int | None:
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise _invalid(f"{param}[anchor]", f"Invalid '{param}[anchor]': {anchor!r}; only 'created_at' is supported.")
    try:
        value = int(seconds)
    except (TypeError, ValueError):
        raise _invalid(f"{param}[seconds]", f"Invalid '{param}[seconds]': {seconds!r}.") from None
    if not 3600 <= value <= 2_592_000:
        raise _invalid(f"{param}[seconds]", f"Invalid '{param}[seconds]': {value}; allowed 3600 to 2592000.")
    return value


class OpenAIApi:
    """Handlers for the OpenAI routes (a variant such as Azure's subclasses it: :mod:`.azure_api`)."""

    #: What a batch create accepts: its endpoints, and requests per input file.
    batch_endpoints: frozenset[str] = BATCH_ENDPOINTS
    max_lines: int = MAX_LINES

    def __init__(self, store: Store, runner: OpenAIRunner, config: EmulatorConfig) -> None:
        self.store = store
        self.runner = runner
        self.config = config

    def routes(self) -> list[tuple[str, str, Handler]]:
        """Return (method, path regex, handler) for every OpenAI route."""
        routes: list[tuple[str, str, Handler]] = [
            ("POST", r"/v1/files", self.upload_file),
            ("GET", r"/v1/files", self.list_files),
            ("GET", r"/v1/files/(?P<file_id>[^/]+)", self.get_file),
            ("DELETE", r"/v1/files/(?P<file_id>[^/]+)", self.delete_file),
            ("GET", r"/v1/files/(?P<file_id>[^/]+)/content", self.file_content),
            ("POST", r"/v1/batches", self.create_batch),
            ("GET", r"/v1/batches", self.list_batches),
            ("GET", r"/v1/batches/(?P<batch_id>[^/]+)", self.get_batch),
            ("POST", r"/v1/batches/(?P<batch_id>[^/]+)/cancel", self.cancel_batch),
        ]
        for endpoint in sorted(BATCH_ENDPOINTS):
            routes.append(("POST", endpoint, self.realtime_handler(endpoint)))
        return routes

    # files ------------------------------------------------------------------------------------

    def _file(self, file_id: str) -> StoredFile:
        stored = self.store.files.get(file_id)
        if stored is None:
            raise OpenAIError(404, f"No such File object: {file_id}", param="id")
        return stored

    def upload_file(self, req: Request) -> Response:
        """POST /v1/files: store a multipart upload in memory."""
        form = req.form(openai_error)
        if "purpose" not in form:
            raise _missing("purpose")
        if "file" not in form:
            raise _missing("file")
        purpose = form["purpose"].data.decode("utf-8", "replace").strip()
        if purpose not in FILE_PURPOSES:
            raise _invalid(
                "purpose", f"Invalid value for 'purpose': {purpose!r}; expected one of {sorted(FILE_PURPOSES)}."
            )
        anchor = form.get("expires_after[anchor]")
        seconds = form.get("expires_after[seconds]")
        ttl = _expiry_seconds(
            anchor.data.decode() if anchor else None, seconds.data.decode() if seconds else None, "expires_after"
        )
        if ttl is None and purpose == "batch":
            ttl = DEFAULT_FILE_TTL
        part = form["file"]
        stored = self.store.add_file(part.filename or "upload.jsonl", purpose, part.data, ttl)
        self.store.bump("openai", "files_uploaded")
        return json_response(stored.to_json())

    def list_files(self, req: Request) -> Response:
        """GET /v1/files: newest first unless ``order=asc``; filter by ``purpose``."""
        limit = _limit(req.query, 10_000, 10_000)
        with self.store.lock:
            files = [f.to_json() for f in self.store.files.values()]
        purpose = req.query.get("purpose")
        if purpose:
            files = [f for f in files if f["purpose"] == purpose]
        if req.query.get("order", "desc") != "asc":
            files.reverse()
        return json_response(_page(files, req.query.get("after"), limit))

    def get_file(self, req: Request) -> Response:
        """GET /v1/files/{id}."""
        return json_response(self._file(req.params["file_id"]).to_json())

    def delete_file(self, req: Request) -> Response:
        """DELETE /v1/files/{id}."""
        file_id = req.params["file_id"]
        with self.store.lock:
            self._file(file_id)
            del self.store.files[file_id]
            self.store.counters["openai"]["files_deleted"] += 1
        return json_response({"id": file_id, "object": "file", "deleted": True})

    def file_content(self, req: Request) -> Response:
        """GET /v1/files/{id}/content: the raw bytes (the server sends them in pieces)."""
        stored = self._file(req.params["file_id"])
        return Response(body=stored.data, content_type="application/octet-stream")

    # batches ----------------------------------------------------------------------------------

    def _batch(self, batch_id: str) -> OpenAIBatch:
        batch = self.store.openai_batches.get(batch_id)
        if batch is None:
            raise OpenAIError(404, f"No batch found with id '{batch_id}'.")
        return batch

    def create_batch(self, req: Request) -> Response:
        """POST /v1/batches: check the request, then queue the batch in ``validating``."""
        body = req.json(openai_error)
        for param in ("input_file_id", "endpoint", "completion_window"):
            if not body.get(param):
                raise _missing(param)
        endpoint = body["endpoint"]
        if endpoint not in self.batch_endpoints:
            raise _invalid(
                "endpoint", f"Invalid value for 'endpoint': {endpoint!r}; supported: {sorted(self.batch_endpoints)}."
            )
        if body["completion_window"] != "24h":
            raise _invalid(
                "completion_window", f"Invalid 'completion_window': {body['completion_window']!r}; only '24h'."
            )
        metadata = check_metadata(body.get("metadata"))
        output_expiry = body.get("output_expires_after") or {}
        ttl = _expiry_seconds(output_expiry.get("anchor"), output_expiry.get("seconds"), "output_expires_after")
        file_id = body["input_file_id"]
        stored = self.store.files.get(file_id)
        if stored is None:
            raise OpenAIError(
                400, f"Invalid 'input_file_id': no file found with id '{file_id}'.", param="input_file_id"
            )
        if stored.purpose != "batch":
            msg = f"Invalid 'input_file_id': file {file_id} has purpose {stored.purpose!r}; it must be 'batch'."
            raise OpenAIError(400, msg, param="input_file_id")
        batch = OpenAIBatch(
            id=self.store.new_id("batch_", 32),
            input_file_id=file_id,
            endpoint=endpoint,
            completion_window="24h",
            metadata=metadata,
            created_at=int(time.time()),
            faults=self.store.faults,
            request_count_hint=stored.data.count(b"\n") + (0 if stored.data.endswith(b"\n") or not stored.data else 1),
            output_expires_after=ttl or DEFAULT_FILE_TTL,
            max_lines=self.max_lines,
            due=time.monotonic() + self.config.latency,
        )
        with self.store.lock:
            self.store.openai_batches[batch.id] = batch
            self.store.counters["openai"]["batches_created"] += 1
        log.info("openai batch %s: created (validating) with %d line(s)", batch.id, batch.request_count_hint)
        self.store.wakeup.set()
        return json_response(batch.to_json())

    def list_batches(self, req: Request) -> Response:
        """GET /v1/batches?after=&limit=: newest first, at most 100 per page."""
        limit = _limit(req.query, 20, 100)
        with self.store.lock:
            items = [b.to_json() for b in reversed(self.store.openai_batches.values())]
        return json_response(_page(items, req.query.get("after"), limit))

    def get_batch(self, req: Request) -> Response:
        """GET /v1/batches/{id} (counts towards ``polls_before_done``; listing does not)."""
        batch = self._batch(req.params["batch_id"])
        self.runner.polled(batch)
        with self.store.lock:
            return json_response(batch.to_json())

    def cancel_batch(self, req: Request) -> Response:
        """POST /v1/batches/{id}/cancel: 409 once the batch has ended."""
        batch = self._batch(req.params["batch_id"])
        with self.store.lock:
            if batch.status in ("completed", "failed", "expired"):
                msg = f"Cannot cancel batch {batch.id}: its status is already '{batch.status}'."
                raise OpenAIError(409, msg, headers=NO_RETRY)
            self.runner.cancel(batch, time.monotonic())
            return json_response(batch.to_json())

    # realtime ---------------------------------------------------------------------------------

    def realtime_handler(self, endpoint: str) -> Handler:
        """Return the handler of one realtime model endpoint (Azure serves it under its deployment paths)."""
        builder = OPENAI_BUILDERS[endpoint]

        def handle(req: Request) -> Response:
            body = req.json(openai_error)
            if body.get("stream"):
                raise _invalid("stream", "stream=true is not supported by the emulator.")
            faults = self.store.faults
            if not self.store.realtime_enter(faults.realtime_max_in_flight):
                wait = faults.retry_after
                raise OpenAIError(
                    429,
                    f"Server at capacity: {faults.realtime_max_in_flight} requests in flight (emulator fault "
                    "realtime_max_in_flight).",
                    type="rate_limit_error",
                    headers={"retry-after": f"{wait:g}", "retry-after-ms": str(int(wait * 1000))},
                )
            self.store.realtime_priority(body)
            try:
                self.store.scheduler.run(request_priority(body), self.config.realtime_delay)
                try:
                    result = builder(body, int(time.time()))
                    unique_id(result, self.store.new_realtime_id())
                    if endpoint in CUTTABLE_ENDPOINTS and cut_short_realtime(faults, body):
                        cut_openai_answer(result)
                except ParamError as exc:
                    raise OpenAIError(400, exc.message, param=exc.param) from None
            finally:
                self.store.realtime_exit()
            return json_response(result)

        return handle
