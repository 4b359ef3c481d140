"""Anthropic routes: ``/v1/messages/batches`` (create, list, retrieve, cancel, delete, results)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from airflow_batch_emulator.anthropic_batch import AnthropicRunner, message
from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.faults import cut_short_realtime
from airflow_batch_emulator.records import AnthropicBatch
from airflow_batch_emulator.store import Store
from airflow_batch_emulator.synth import ParamError, cut_anthropic_answer, unique_id
from airflow_batch_emulator.wire import (
    AnthropicError,
    Request,
    Response,
    anthropic_error,
    json_response,
)

log = logging.getLogger("airflow_batch_emulator")

Handler = Callable[[Request], Response]

MAX_REQUESTS = 100_000
MAX_BODY_BYTES = 256 * 1024 * 1024
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _bad(message_text: str) -> AnthropicError:
    return AnthropicError(400, "invalid_request_error", message_text)


def _limit(query: dict[str, str]) -> int:
    raw = query.get("limit")
    try:
        value = int(raw) if raw else 20
    except ValueError:
        raise _bad(f"limit: {raw!r} is not an integer") from None
    if not 1 <= value <= 1000:
        raise _bad(f"limit: {value} must be between 1 and 1000")
    return value


class AnthropicApi:
    """Handlers for the Anthropic routes."""

    def __init__(self, store: Store, runner: AnthropicRunner, config: EmulatorConfig) -> None:
        self.store = store
        self.runner = runner
        self.config = config

    def routes(self) -> list[tuple[str, str, Handler]]:
        """Return (method, path regex, handler) for every Anthropic route."""
        batch = r"/v1/messages/batches/(?P<batch_id>[^/]+)"
        return [
            ("POST", r"/v1/messages/batches", self.create_batch),
            ("GET", r"/v1/messages/batches", self.list_batches),
            ("GET", batch, self.get_batch),
            ("DELETE", batch, self.delete_batch),
            ("POST", batch + "/cancel", self.cancel_batch),
            ("GET", batch + "/results", self.results),
            ("POST", r"/v1/messages", self.realtime_message),
        ]

    def _batch(self, batch_id: str) -> AnthropicBatch:
        batch = self.store.anthropic_batches.get(batch_id)
        if batch is None:
            raise AnthropicError(404, "not_found_error", f"Message batch {batch_id!r} not found.")
        return batch

    def create_batch(self, req: Request) -> Response:
        """POST /v1/messages/batches: check the size and custom_ids, then start processing."""
        if len(req.body) > MAX_BODY_BYTES:
            raise AnthropicError(413, "request_too_large", f"Request body of {len(req.body)} bytes exceeds 256 MB.")
        body = req.json(anthropic_error)
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise _bad("requests: Field required (a non-empty list of {custom_id, params})")
        if len(requests) > MAX_REQUESTS:
            raise AnthropicError(
                413, "request_too_large", f"A batch holds at most {MAX_REQUESTS} requests; got {len(requests)}."
            )
        pairs: list[tuple[str, Any]] = []
        seen: set[str] = set()
        for index, item in enumerate(requests):
            if not isinstance(item, dict) or "params" not in item:
                raise _bad(f"requests.{index}: each request needs 'custom_id' and 'params'")
            custom_id = item.get("custom_id")
            if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
                raise _bad(
                    f"requests.{index}.custom_id: {custom_id!r} must be 1-64 characters of letters, digits, '_' or '-'"
                )
            if custom_id in seen:
                raise _bad(f"requests.{index}.custom_id: {custom_id!r} is a duplicate; custom_id must be unique")
            seen.add(custom_id)
            pairs.append((custom_id, item["params"]))
        now = time.time()
        batch_id = self.store.new_id("msgbatch_", 24)
        faults = self.store.faults
        batch = AnthropicBatch(
            id=batch_id,
            created_at=now,
            faults=faults,
            requests=pairs,
            results_url=f"{req.base_url}/v1/messages/batches/{batch_id}/results",
            due=time.monotonic(),
            phase_start=time.monotonic(),
            cancel_at_line=len(pairs) // 2 if faults.cancel_batches else None,
        )
        with self.store.lock:
            self.store.anthropic_batches[batch_id] = batch
            self.store.counters["anthropic"]["batches_created"] += 1
        log.info("anthropic batch %s: created (in_progress) with %d request(s)", batch_id, len(pairs))
        self.store.wakeup.set()
        return json_response(batch.to_json())

    def list_batches(self, req: Request) -> Response:
        """GET /v1/messages/batches?after_id=&before_id=&limit=: newest first."""
        limit = _limit(req.query)
        with self.store.lock:
            items = [b.to_json() for b in reversed(self.store.anthropic_batches.values())]
        ids = [item["id"] for item in items]
        after, before = req.query.get("after_id"), req.query.get("before_id")
        if before:
            end = ids.index(before) if before in ids else 0
            start = max(0, end - limit)
            has_more = start > 0
        else:
            start = (ids.index(after) + 1 if after in ids else len(ids)) if after else 0
            end = start + limit
            has_more = end < len(items)
        data = items[start:end]
        return json_response(
            {
                "data": data,
                "has_more": has_more,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )

    def get_batch(self, req: Request) -> Response:
        """GET /v1/messages/batches/{id} (counts towards ``polls_before_done``; listing does not)."""
        batch = self._batch(req.params["batch_id"])
        self.runner.polled(batch)
        with self.store.lock:
            return json_response(batch.to_json())

    def cancel_batch(self, req: Request) -> Response:
        """POST …/{id}/cancel: in_progress → canceling; an ended batch is returned as it is."""
        batch = self._batch(req.params["batch_id"])
        with self.store.lock:
            self.runner.cancel(batch, time.monotonic())
            return json_response(batch.to_json())

    def delete_batch(self, req: Request) -> Response:
        """DELETE …/{id}: only once the batch has ended."""
        batch_id = req.params["batch_id"]
        with self.store.lock:
            batch = self._batch(batch_id)
            if batch.status != "ended":
                raise _bad(f"Message batch {batch_id} is {batch.status}; it can be deleted only once it has ended.")
            del self.store.anthropic_batches[batch_id]
            self.store.counters["anthropic"]["batches_deleted"] += 1
        return json_response({"id": batch_id, "type": "message_batch_deleted"})

    def results(self, req: Request) -> Response:
        """GET …/{id}/results: JSONL, ``\\n`` line ends, no blank lines; only once ended."""
        batch = self._batch(req.params["batch_id"])
        blob = batch.results_blob
        if batch.status != "ended" or blob is None:
            raise AnthropicError(
                404, "not_found_error", f"Results of message batch {batch.id} are not available until it has ended."
            )
        return Response(body=blob, content_type="application/x-jsonl")

    def realtime_message(self, req: Request) -> Response:
        """POST /v1/messages: answer one Messages request directly."""
        params = req.json(anthropic_error)
        if params.get("stream"):
            raise _bad("stream: streaming is not supported by the emulator")
        self.store.realtime_enter()
        try:
            self.store.scheduler.run(0, self.config.realtime_delay)
            try:
                answer = message(params)
                unique_id(answer, self.store.new_realtime_id())
                if cut_short_realtime(self.store.faults, params):
                    cut_anthropic_answer(answer)
                return json_response(answer)
            except ParamError as exc:
                raise _bad(exc.message) from None
        finally:
            self.store.realtime_exit()
