"""AnthropicBatchHook: Anthropic Message Batches through the official SDK.

Connection (type ``anthropic_batch``, default id ``anthropic_batch_default``): the API key in
the password field; the base URL (without ``/v1``) in the extra ``base_url`` or the host field;
empty means the public API. A connection of type ``anthropic`` works too.

Message Batches take the requests inline (no file upload) and carry no metadata, so crash
recovery cannot search by an idempotency key. Instead :meth:`find_existing` lists candidates
(created after the recorded submission intent, with the chunk's request count) and :meth:`owns`
proves one is the chunk's from its first result's custom_id once it ended; a running candidate is
adopted only provisionally and checked when it ends (see ``submit_once`` and the sensor).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import time
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import anthropic
import httpx2
import orjson
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_batch_provider.backends.anthropic import ANTHROPIC_LIMITS
from airflow_batch_provider.backends.anthropic.results import parse_anthropic_result
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord
from airflow_batch_provider.exceptions import UnknownBatchStatusError
from airflow_batch_provider.hooks.sdk_hook import SdkBatchHook, json_object
from airflow_batch_provider.links import console_url
from airflow_batch_provider.status import BatchState, BatchStatus, RequestCounts
from airflow_batch_provider.utils.retry import (
    call_with_retries,
    iter_with_restarts,
    retry_after_seconds,
)
from airflow_batch_provider.utils.storage import to_path

# Allowed clock difference between this worker and the provider when matching by creation time, when the
# provider's answer has no Date header to measure it by; with one, DATE_SLACK_S covers its 1 s resolution.
CLOCK_SKEW_S = 120.0
DATE_SLACK_S = 2.0


def map_anthropic_status(batch: Any) -> BatchStatus:
    """Map a MessageBatch to :class:`BatchStatus`; raise on a processing status we do not know.

    ``ended`` splits three ways: cancelled (a cancel was initiated), expired (some requests
    expired before being processed), otherwise completed.
    """
    status = batch.processing_status
    if status == "in_progress":
        return BatchStatus.IN_PROGRESS
    if status == "canceling":
        return BatchStatus.CANCELLING
    if status == "ended":
        if batch.cancel_initiated_at is not None:
            return BatchStatus.CANCELLED
        if batch.request_counts is not None and batch.request_counts.expired:
            return BatchStatus.EXPIRED
        return BatchStatus.COMPLETED
    raise UnknownBatchStatusError(
        f"Anthropic batch {batch.id} reports processing_status {status!r}, which this provider does not know "
        "(known: in_progress, canceling, ended). Upgrade airflow-batch-provider or report it."
    )


def classify_anthropic_error(exc: BaseException) -> tuple[bool, float | None]:
    """Say whether an SDK error is worth another attempt, and how long the server asked us to wait.

    A connection that breaks while results stream surfaces as ``httpx2.TransportError``: retryable.
    """
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        return True, None
    if isinstance(exc, anthropic.APIStatusError):
        retryable = exc.status_code in (408, 409, 429, 529) or exc.status_code >= 500
        return retryable, retry_after_seconds(exc.response.headers)
    return False, None


def classify_unsent_create(exc: BaseException) -> tuple[bool, float | None]:
    """Retry a batch create only when it certainly did nothing: refused (429, 529) or never connected.

    A timeout, a 5xx or a connection lost after the request went out may have created the batch.
    """
    if isinstance(exc, anthropic.APIStatusError) and exc.status_code in (429, 529):
        return True, retry_after_seconds(exc.response.headers)
    cause = exc.__cause__ if isinstance(exc, anthropic.APIConnectionError) else exc
    unsent = isinstance(cause, httpx2.ConnectError) and not isinstance(exc, anthropic.APITimeoutError)
    return unsent, None


def state_from_anthropic(batch: Any) -> BatchState:
    """Build a :class:`BatchState` from an SDK ``MessageBatch``."""
    c = batch.request_counts
    total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
    return BatchState(
        batch_id=batch.id,
        provider="anthropic",
        status=map_anthropic_status(batch),
        provider_status=batch.processing_status,
        counts=RequestCounts(total=total, completed=c.succeeded, failed=c.errored + c.canceled + c.expired),
        results_url=batch.results_url,
        created_at=_created_epoch(batch),
        ended_at=_epoch(batch.ended_at) if batch.ended_at else None,
    )


def chunk_custom_ids(chunk: ChunkDescriptor) -> set[str]:
    """Return the custom ids of the chunk's request lines (read from its requests file)."""
    with to_path(chunk["requests_path"]).open("rb") as handle:
        return {str(orjson.loads(line).get("custom_id")) for line in handle if line.strip()}


def clock_offset(date_header: str | None, asked_at: float) -> float | None:
    """Return the provider's clock minus ours from an answer's ``Date`` header (None: no usable header).

    ``asked_at`` is when the request was sent: the header was stamped after it, so the offset
    errs low by the request's latency plus the header's one-second resolution.
    """
    try:
        stamped = email.utils.parsedate_to_datetime(date_header or "")
    except (TypeError, ValueError):
        return None
    return stamped.timestamp() - asked_at if stamped.tzinfo is not None else None


def _created_epoch(batch: Any) -> float:
    return _epoch(batch.created_at)


def _epoch(value: dt.datetime | str) -> float:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return float(value.timestamp())


def _batch_result_line(custom_id: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """Return a Message Batches result for one real-time answer (status 200) or API error."""
    if status == 200:
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": body}}
    return {"custom_id": custom_id, "result": {"type": "errored", "error": {"type": "error", "error": body}}}


class AnthropicBatchHook(SdkBatchHook[anthropic.Anthropic, anthropic.AsyncAnthropic]):
    """Submit chunk files as Anthropic Message Batches, poll, cancel and stream results.

    :param conn_id: Airflow connection id (type ``anthropic_batch`` or ``anthropic``).
    :param retry_policy: attempts above the SDK's own retries for every API call.
    :param max_retries: the SDK's own retry count.
    :param timeout: per-request timeout in seconds.
    """

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str] = "anthropic_batch_default"
    list_page_size: ClassVar[int] = 100  # one list call answers up to 100 waiting batches
    conn_type = "anthropic_batch"
    hook_name = "Anthropic Message Batches"

    provider: ClassVar[str] = "anthropic"
    limits: ClassVar[ProviderLimits] = ANTHROPIC_LIMITS

    sync_client_class = anthropic.Anthropic
    async_client_class = anthropic.AsyncAnthropic
    sdk_error = anthropic.AnthropicError

    def classify_error(self, exc: BaseException) -> tuple[bool, float | None]:
        """Classify an Anthropic SDK error for the retry policy (:func:`classify_anthropic_error`)."""
        return classify_anthropic_error(exc)

    def create_batch(self, chunk: ChunkDescriptor, *, input_file_id: str | None, metadata: Mapping[str, str]) -> str:
        """Read the chunk's ``{custom_id, params}`` lines and create one Message Batch from them.

        Requests go inline (no upload step, so ``input_file_id`` is None); ``metadata`` is not
        sent (Message Batches have no metadata field).
        """
        with to_path(chunk["requests_path"]).open("rb") as handle:
            requests = [orjson.loads(line) for line in handle if line.strip()]
        # Never resent when its outcome is unknown: the batch may exist, and without metadata only the
        # task's retry can look for it (submit_once: find_existing, then owns). The SDK retries nothing.
        client = self.client.with_options(max_retries=0)
        batch = call_with_retries(
            lambda: client.messages.batches.create(requests=requests),
            what=f"{chunk['label']}: batch create",
            classify=classify_unsent_create,
            policy=self.retry_policy,
        )
        self.log.info("%s: created message batch %s", chunk["label"], batch.id)
        return str(batch.id)

    def find_existing(
        self, idempotency_key: str, chunk: ChunkDescriptor, *, since: float | None = None
    ) -> list[BatchState]:
        """Return batches created after ``since`` (minus clock skew) with the chunk's request count, newest first.

        Only candidates: chunks are usually all the same size, so a match may be another chunk's
        batch. :meth:`owns` tells them apart. Without ``since`` nothing can be matched safely.
        """
        if since is None:
            return []
        asked = time.time()
        raw = self._call("batch list", lambda: self.client.messages.batches.with_raw_response.list(limit=100))
        offset = clock_offset(raw.headers.get("date"), asked)
        # On the provider's clock when its answer says what time it is: a batch of another run over the same
        # rows, made shortly before the intent, must not pass for the chunk's own (its rows would prove it).
        oldest = since - CLOCK_SKEW_S if offset is None else since + offset - DATE_SLACK_S
        found: list[BatchState] = []
        for batch in raw.parse():
            if _created_epoch(batch) < oldest:
                break  # newest first (the SDK pages on): everything further is older
            state = state_from_anthropic(batch)
            if state.counts.total == chunk["num_requests"]:
                found.append(state)
        return found

    def iter_unkeyed_batches(self, since: float) -> Iterator[BatchState]:
        """Yield the batches created since ``since``, newest first (the SDK pages on)."""
        for batch in self._call("batch list", lambda: self.client.messages.batches.list(limit=100)):
            if _created_epoch(batch) < since:
                return
            yield state_from_anthropic(batch)

    def owns(self, state: BatchState, chunk: ChunkDescriptor) -> bool | None:
        """Prove from an ended batch's first result that it is ``chunk``'s: its custom_id is one of the chunk's.

        Custom ids are row ids, unique across a job's chunks. A batch still running shows no
        requests (the API has no such route): None, not known yet.
        """
        if not state.status.is_terminal:
            return None
        try:
            first = next(self._stream_results(state.batch_id), None)
        except Exception as exc:  # no results (a batch cancelled before any ran): nothing proves it
            self.log.info("%s: batch %s has no readable results (%s)", chunk["label"], state.batch_id, exc)
            return None
        if first is None:
            return None
        return str(first.get("custom_id")) in chunk_custom_ids(chunk)

    def get_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state."""
        batch = self._call(f"status of batch {batch_id}", lambda: self.client.messages.batches.retrieve(batch_id))
        return state_from_anthropic(batch)

    async def aget_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state using the async client."""
        client = await self.aget_client()
        batch = await self._acall(f"status of batch {batch_id}", lambda: client.messages.batches.retrieve(batch_id))
        return state_from_anthropic(batch)

    async def alist_states(self) -> AsyncGenerator[list[BatchState], None]:
        """Yield pages of recent batches, newest first (``messages.batches.list``, one call per page)."""
        client = await self.aget_client()
        page = await self._acall("batch list", lambda: client.messages.batches.list(limit=self.list_page_size))
        while True:
            yield [state_from_anthropic(batch) for batch in page.data]
            if not page.has_next_page():
                return
            page = await self._acall("batch list (next page)", page.get_next_page)

    def cancel(self, batch_id: str) -> BatchState:
        """Ask Anthropic to cancel the batch (``canceling``, then ``ended`` with canceled results)."""
        batch = self._call(f"cancel of batch {batch_id}", lambda: self.client.messages.batches.cancel(batch_id))
        return state_from_anthropic(batch)

    async def acancel(self, batch_id: str) -> BatchState:
        """Async twin of :meth:`cancel`."""
        client = await self.aget_client()
        batch = await self._acall(f"cancel of batch {batch_id}", lambda: client.messages.batches.cancel(batch_id))
        return state_from_anthropic(batch)

    def _stream_results(self, batch_id: str) -> Generator[dict[str, Any]]:
        decoder = self._call(f"results of batch {batch_id}", lambda: self.client.messages.batches.results(batch_id))
        try:
            for item in decoder:
                yield item.model_dump(mode="json")
        finally:
            decoder.close()  # release the connection now, also when the caller stops early

    def iter_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Stream the batch's results (the SDK follows ``results_url`` and decodes JSONL lazily).

        A connection that breaks mid-stream reopens the results (with our retry policy) and
        skips the results already yielded: none is lost, none comes twice.
        """
        items = iter_with_restarts(
            lambda: self._stream_results(state.batch_id),
            what=f"results of batch {state.batch_id}",
            classify=self.classify_error,
            policy=self.retry_policy,
        )
        for item in items:
            yield parse_anthropic_result(item)

    def answer_now(self, request_lines: Sequence[bytes], *, model: str) -> list[bytes]:
        """POST each line's ``params``, as they are, to ``/v1/messages``; return Message Batches result lines.

        The SDK's generic ``post`` rather than ``messages.create(**params)``, which refuses keys its
        signature lacks: the canary sends what the batch will.
        """
        return self._answer_each(
            request_lines,
            lambda request: json_object(self.client.post("/v1/messages", body=request["params"], cast_to=object)),
            _batch_result_line,
        )

    def batch_url(self, batch_id: str) -> str | None:
        """Link to the batch in the Anthropic console; None when the connection points elsewhere."""
        try:  # a link never fails a task: no connection or no key gives no link
            base_url = str(self.client.base_url)
        except (AirflowNotFoundException, anthropic.AnthropicError):
            return None
        return console_url("anthropic", base_url, batch_id)
