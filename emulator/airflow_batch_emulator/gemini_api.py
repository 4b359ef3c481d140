"""Gemini Developer API routes behind the ``google-genai`` SDK's base URL (``/v1beta/...``, ``/upload/v1beta/...``).

- Files: resumable upload (``POST /upload/v1beta/files`` with ``X-Goog-Upload-Command: start``
  answers an ``x-goog-upload-url``; chunks go there with ``upload`` / ``upload, finalize``),
  ``GET``/``DELETE /v1beta/files/{id}``, ``GET /v1beta/files/{id}:download?alt=media``.
- Batches: ``POST /v1beta/models/{model}:batchGenerateContent``, ``GET /v1beta/batches``
  (``pageSize``, ``pageToken``), ``GET``/``DELETE /v1beta/batches/{id}``, ``POST …/{id}:cancel``.
- Realtime: ``POST /v1beta/models/{model}:generateContent``.

Errors use Google's envelope ``{"error": {"code", "message", "status"}}``. The SDK sends the key
as ``x-goog-api-key``, except on upload chunks, which the upload URL's id authorises (as Google's
upload service does): :func:`is_upload_session` tells the server so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.gemini_batch import GeminiFile, GeminiJob, GeminiRunner, generate_content
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import ParamError
from airflow_batch_emulator.wire import ApiError, Request, Response, json_response

log = logging.getLogger("airflow_batch_emulator")

Handler = Callable[[Request], Response]
PREFIX = "/v1beta"
UPLOAD_PATH = "/upload/v1beta/files"
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
MAX_FILE_BYTES = 2048 * 1024 * 1024


class GeminiError(ApiError):
    """An error in Google's envelope ``{"error": {code, message, status}}``."""

    def __init__(self, status: int, message: str, state: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.state = state or _STATUS.get(status, "UNKNOWN")
        self.headers: dict[str, str] = {}

    def payload(self) -> dict[str, Any]:
        """Return the JSON error body."""
        return {"error": {"code": self.status, "message": self.message, "status": self.state}}


def gemini_error(status: int, kind: str, message: str) -> ApiError:
    """Build a Gemini error from a generic (status, kind, message) triple."""
    return GeminiError(status, message)


def is_gemini_path(path: str) -> bool:
    """Return True for the paths these routes serve."""
    return path.startswith((PREFIX + "/", "/upload" + PREFIX + "/"))


def is_upload_session(req: Request) -> bool:
    """Return True for an upload chunk (its upload id authorises it; the SDK sends no API key with it)."""
    return req.path == UPLOAD_PATH and bool(req.query.get("upload_id"))


def _page(query: dict[str, str]) -> tuple[int, int]:
    try:
        size = int(query.get("pageSize") or 50)
        start = int(query.get("pageToken") or 0)
    except ValueError:
        raise GeminiError(400, "pageSize and pageToken must be integers") from None
    if not 1 <= size <= 1000 or start < 0:
        raise GeminiError(400, f"pageSize must be 1 … 1000 (got {size}); pageToken must come from a listing")
    return size, start


class GeminiApi:
    """Handlers for the Gemini routes, and the files, upload sessions and jobs behind them."""

    def __init__(self, store: Store, config: EmulatorConfig) -> None:
        from collections import Counter

        self.store = store
        self.config = config
        store.counters.setdefault("gemini", Counter())
        self.files: dict[str, GeminiFile] = {}
        self.uploads: dict[str, dict[str, Any]] = {}
        self.runner = GeminiRunner(store, self.files, config.latency, config.slice_size)

    def routes(self) -> list[tuple[str, str, Handler]]:
        """Return (method, path regex, handler) for every Gemini route."""
        files, batches, models = (
            PREFIX + "/files/(?P<file_id>[^/:]+)",
            PREFIX + "/batches",
            PREFIX + "/models/(?P<model>[^/:]+)",
        )
        return [
            ("POST", UPLOAD_PATH, self.upload),
            ("GET", files, self.get_file),
            ("DELETE", files, self.delete_file),
            ("GET", files + ":download", self.download),
            ("POST", models + ":batchGenerateContent", self.create_batch),
            ("POST", models + ":generateContent", self.generate),
            ("GET", batches, self.list_batches),
            ("GET", batches + "/(?P<batch_id>[^/:]+)", self.get_batch),
            ("DELETE", batches + "/(?P<batch_id>[^/:]+)", self.delete_batch),
            ("POST", batches + "/(?P<batch_id>[^/:]+):cancel", self.cancel_batch),
        ]

    def start(self) -> None:
        """Start the job worker."""
        self.runner.start()

    def close(self) -> None:
        """Stop the job worker."""
        self.runner.stop()

    def reset(self) -> None:
        """Forget every file, upload and job."""
        with self.store.lock:
            self.files.clear()
            self.uploads.clear()
            self.runner.jobs.clear()

    def batches(self, include_custom_ids: bool = False) -> list[dict[str, Any]]:
        """List every job like ``GET /_emulator/batches`` does for the other APIs."""
        with self.store.lock:
            jobs = list(self.runner.jobs.values())
        rows = []
        for job in jobs:
            row: dict[str, Any] = {
                "provider": "gemini",
                "id": job.name,
                "status": job.state,
                "model": job.model,
                "display_name": job.display_name,
                "custom_id_count": len(job.lines),
                "created_at": int(job.created),
                "polls": job.polls,
                "held": bool(job.held),
            }
            if include_custom_ids:
                row["custom_ids"] = [key for key, _ in job.lines]
            rows.append(row)
        return rows

    # files --------------------------------------------------------------------------------------

    def upload(self, req: Request) -> Response:
        """``POST /upload/v1beta/files``: start a resumable upload, or take one chunk of it."""
        if is_upload_session(req):
            return self._upload_chunk(req)
        if (
            req.headers.get("X-Goog-Upload-Protocol") != "resumable"
            or req.headers.get("X-Goog-Upload-Command") != "start"
        ):
            raise GeminiError(400, "Only resumable uploads are supported (X-Goog-Upload-Protocol: resumable, start).")
        meta = req.json(gemini_error).get("file") or {}
        size = int(req.headers.get("X-Goog-Upload-Header-Content-Length") or meta.get("sizeBytes") or 0)
        if size > MAX_FILE_BYTES:
            raise GeminiError(400, f"File of {size} bytes exceeds the 2 GB limit.")
        upload_id = self.store.new_id("up", 20)
        mime = (
            req.headers.get("X-Goog-Upload-Header-Content-Type") or meta.get("mimeType") or "application/octet-stream"
        )
        with self.store.lock:
            self.uploads[upload_id] = {
                "size": size,
                "mime": mime,
                "display": meta.get("displayName") or "",
                "data": bytearray(),
            }
        url = f"{req.base_url}{UPLOAD_PATH}?upload_id={quote(upload_id)}&upload_protocol=resumable"
        return json_response({}, headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"})

    def _upload_chunk(self, req: Request) -> Response:
        upload_id = req.query["upload_id"]
        with self.store.lock:
            session = self.uploads.get(upload_id)
            if session is None:
                raise GeminiError(404, f"Upload session {upload_id!r} not found.")
            offset = int(req.headers.get("X-Goog-Upload-Offset") or 0)
            if offset != len(session["data"]):
                raise GeminiError(
                    400, f"Upload offset {offset} does not match the {len(session['data'])} bytes received."
                )
            session["data"] += req.body
            command = req.headers.get("X-Goog-Upload-Command", "")
            if "finalize" not in command:
                return json_response({}, headers={"x-goog-upload-status": "active"})
            del self.uploads[upload_id]
            name = self.store.new_id("files/", 16)
            stored = GeminiFile(name, session["display"], session["mime"], bytes(session["data"]), time.time())
            self.files[name] = stored
            self.store.counters["gemini"]["files_uploaded"] += 1
        return json_response({"file": stored.to_json(req.base_url)}, headers={"x-goog-upload-status": "final"})

    def _file(self, file_id: str) -> GeminiFile:
        stored = self.files.get(f"files/{file_id}")
        if stored is None:
            raise GeminiError(404, f"File files/{file_id} not found.")
        return stored

    def get_file(self, req: Request) -> Response:
        """``GET /v1beta/files/{id}``."""
        return json_response(self._file(req.params["file_id"]).to_json(req.base_url))

    def delete_file(self, req: Request) -> Response:
        """``DELETE /v1beta/files/{id}``."""
        with self.store.lock:
            del self.files[self._file(req.params["file_id"]).name]
        return json_response({})

    def download(self, req: Request) -> Response:
        """``GET /v1beta/files/{id}:download?alt=media``: only generated files (uploads cannot be downloaded)."""
        stored = self._file(req.params["file_id"])
        if stored.source != "GENERATED":
            raise GeminiError(400, f"File {stored.name} was uploaded; only generated files can be downloaded.")
        self.store.bump("gemini", "files_downloaded")
        return Response(body=stored.data, content_type="application/octet-stream")

    # batches ------------------------------------------------------------------------------------

    def _job(self, batch_id: str) -> GeminiJob:
        job = self.runner.jobs.get(f"batches/{batch_id}")
        if job is None:
            raise GeminiError(404, f"Batch batches/{batch_id} not found.")
        return job

    def create_batch(self, req: Request) -> Response:
        """``POST /v1beta/models/{model}:batchGenerateContent``: a batch over an uploaded file."""
        batch = req.json(gemini_error).get("batch")
        if not isinstance(batch, dict):
            raise GeminiError(400, "batch: required")
        display = batch.get("displayName")
        if not isinstance(display, str) or not display:
            raise GeminiError(400, "batch.displayName: required")
        source = batch.get("inputConfig") or {}
        file_name = source.get("fileName") if isinstance(source, dict) else None
        if not isinstance(file_name, str) or file_name not in self.files:
            raise GeminiError(
                400 if not file_name else 404, f"batch.inputConfig.fileName: file {file_name!r} not found."
            )
        job = GeminiJob(
            self.store.new_id("batches/", 20), f"models/{req.params['model']}", display, file_name, self.store.faults
        )
        job.due = time.monotonic() + self.config.latency
        with self.store.lock:
            self.runner.jobs[job.name] = job
            self.store.counters["gemini"]["batches_created"] += 1
        log.info("gemini batch %s: created (%s) from %s", job.name, display, file_name)
        self.runner.start()
        return json_response(job.to_json())

    def list_batches(self, req: Request) -> Response:
        """``GET /v1beta/batches``: newest first, ``pageSize`` per page; the token is an offset."""
        size, start = _page(req.query)
        with self.store.lock:
            jobs = [job.to_json() for job in reversed(self.runner.jobs.values())]
        body: dict[str, Any] = {"operations": jobs[start : start + size]}
        if start + size < len(jobs):
            body["nextPageToken"] = str(start + size)
        return json_response(body)

    def get_batch(self, req: Request) -> Response:
        """``GET /v1beta/batches/{id}`` (counts towards ``polls_before_done``; listing does not)."""
        job = self._job(req.params["batch_id"])
        self.runner.polled(job)
        with self.store.lock:
            return json_response(job.to_json())

    def cancel_batch(self, req: Request) -> Response:
        """``POST /v1beta/batches/{id}:cancel``: answers ``{}``; the job ends ``CANCELLED`` soon after."""
        self.runner.cancel(self._job(req.params["batch_id"]))
        return json_response({})

    def delete_batch(self, req: Request) -> Response:
        """``DELETE /v1beta/batches/{id}``: forget the job (a running one is cancelled first)."""
        job = self._job(req.params["batch_id"])
        self.runner.cancel(job)
        with self.store.lock:
            self.runner.jobs.pop(job.name, None)
        return json_response({})

    def generate(self, req: Request) -> Response:
        """``POST /v1beta/models/{model}:generateContent``: answer one request directly."""
        body = req.json(gemini_error)
        self.store.realtime_enter()
        try:
            self.store.scheduler.run(0, self.config.realtime_delay)
            return json_response(generate_content(body, f"models/{req.params['model']}"))
        except ParamError as exc:
            raise GeminiError(400, exc.message) from None
        finally:
            self.store.realtime_exit()
