"""OpenAIBatchHook: the OpenAI Batch API (files + batches) through the official SDK.

Connection (type ``openai_batch``, default id ``openai_batch_default``): the API key in the
password field; the base URL in the extra ``base_url`` or the host field (must end in ``/v1``;
empty means the public API); optional extras ``organization`` and ``project``. A connection
of the ``openai`` type made for Airflow's OpenAI provider works too (its
``openai_client_kwargs`` extra is honoured).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import openai
import orjson
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_batch_provider.backends.openai import OPENAI_LIMITS
from airflow_batch_provider.backends.openai.states import (
    classify_openai_error,
    is_dead,
    map_openai_status,
    state_from_openai,
)
from airflow_batch_provider.batches.token_budget import tokens_from_metadata
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY, NoRealtimeEndpointError
from airflow_batch_provider.hooks.sdk_clients import connection_client_kwargs
from airflow_batch_provider.hooks.sdk_hook import SdkBatchHook, json_object
from airflow_batch_provider.links import console_url
from airflow_batch_provider.results.parse import parse_openai_line
from airflow_batch_provider.status import BatchState
from airflow_batch_provider.utils.retry import (
    call_with_retries,
    iter_with_restarts,
)
from airflow_batch_provider.utils.storage import to_path

if TYPE_CHECKING:
    import pyarrow as pa


#: Seconds one batch-create request may take (a small JSON POST; uploads keep the client's 600 s).
CREATE_TIMEOUT = 60.0
#: Seconds after which a failing create is not attempted again (the task fails; its retry reconciles).
CREATE_WITHIN = 180.0
#: Allowed clock difference between this worker and the provider when listing batches since an intent.
CLOCK_SKEW_S = 300.0


#: Batch endpoints answered in real time by the route of the same name, under the client's base URL
#: (for answer_now). OpenAI's lines name them with ``/v1`` in front (the base URL's end), Azure's without.
REALTIME_PATHS = frozenset({"/chat/completions", "/embeddings", "/completions", "/responses"})


def _batch_output_line(custom_id: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """Return an OpenAI batch output line for one real-time answer (status 200) or API error."""
    answer = body if status == 200 else {"error": body}
    return {"custom_id": custom_id, "response": {"status_code": status, "body": answer}}


class OpenAIBatchHook(SdkBatchHook[openai.OpenAI, openai.AsyncOpenAI]):
    """Submit chunk files to the OpenAI Batch API, poll, cancel and stream results.

    :param conn_id: Airflow connection id (type ``openai_batch`` or ``openai``).
    :param retry_policy: attempts above the SDK's own retries for every API call.
    :param max_retries: the SDK's own retry count (keep it > 0: it handles quick blips).
    :param timeout: per-request timeout in seconds.
    """

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str] = "openai_batch_default"
    list_page_size: ClassVar[int] = 100  # one list call answers up to 100 waiting batches
    lists_keys: ClassVar[bool] = True  # listed states carry the key (BatchState.key)
    conn_type = "openai_batch"
    hook_name = "OpenAI Batch"

    provider: ClassVar[str] = "openai"
    limits: ClassVar[ProviderLimits] = OPENAI_LIMITS
    exact_reconcile: ClassVar[bool] = True
    supports_token_budget: ClassVar[bool] = True

    sync_client_class: ClassVar[type[openai.OpenAI]] = openai.OpenAI
    async_client_class: ClassVar[type[openai.AsyncOpenAI]] = openai.AsyncOpenAI
    sdk_error = openai.OpenAIError

    # -- clients ---------------------------------------------------------------------------------
    def classify_error(self, exc: BaseException) -> tuple[bool, float | None]:
        """Classify an OpenAI SDK error for the retry policy (:func:`classify_openai_error`)."""
        return classify_openai_error(exc)

    def sdk_client_kwargs(self, conn: Any) -> dict[str, Any]:
        """Client arguments; a connection of Airflow's own ``openai`` type keeps some in ``openai_client_kwargs``."""
        extra = conn.extra_dejson or {}
        kwargs: dict[str, Any] = dict(extra.get("openai_client_kwargs") or {})
        own_url = extra.get("base_url") or kwargs.pop("base_url", None)
        kwargs.update(
            connection_client_kwargs(conn, max_retries=self.max_retries, timeout=self.timeout, base_url=own_url),
            organization=extra.get("organization") or kwargs.get("organization"),
            project=extra.get("project") or kwargs.get("project"),
        )
        return kwargs

    # -- interface ----------------------------------------------------------------------------------
    def upload_file(self, path: str, *, chunk_label: str = "") -> str:
        """Upload a JSONL chunk file with purpose ``batch``; return the file id (streamed, not read whole)."""
        source = to_path(path)

        def upload() -> Any:
            with source.open("rb") as handle:
                return self.client.files.create(file=(source.name, handle), purpose="batch")

        file_obj = self._call(f"upload of {chunk_label or path}", upload)
        return str(file_obj.id)

    def create_batch(self, chunk: ChunkDescriptor, *, input_file_id: str | None, metadata: Mapping[str, str]) -> str:
        """Create a batch over the uploaded file with the 24 h completion window; return its id."""
        if not input_file_id:
            raise ValueError(f"{chunk['label']}: an OpenAI batch needs an uploaded file (see upload_file)")
        # Bounded: a create still in flight when this task is declared dead can land after the rerun
        # created its own batch (both are then billed). Short attempts, no SDK retries of its own, and
        # no new attempt after CREATE_WITHIN seconds keep that window small; the submit and the sensor
        # reconcile what lands anyway (batches/submission.py: cancel_siblings).
        # A failed attempt may still have made the batch (its answer lost): look the key up before
        # sending it again, or the resend bills the chunk twice.
        client = self.client.with_options(timeout=CREATE_TIMEOUT, max_retries=0)
        key, started = metadata.get(IDEMPOTENCY_METADATA_KEY), time.time()
        batch_id = call_with_retries(
            lambda: str(
                client.batches.create(
                    input_file_id=input_file_id,
                    endpoint=chunk["endpoint"],  # type: ignore[arg-type]
                    completion_window="24h",
                    metadata=dict(metadata),
                ).id
            ),
            what=f"{chunk['label']}: batch create for file {input_file_id}",
            classify=self.classify_error,
            policy=self.retry_policy,
            within=CREATE_WITHIN,
            recover=lambda exc: self._landed(key, started, exc),
        )
        self.log.info("%s: created batch %s from file %s", chunk["label"], batch_id, input_file_id)
        return batch_id

    def _landed(self, key: str | None, since: float, exc: BaseException) -> str | None:
        """Return the id of a live batch a failed create made after all (None: resend)."""
        if not key or (isinstance(exc, openai.APIStatusError) and exc.status_code == 429):
            return None  # a 429 was refused before anything was done
        live = [s for s in self.find_batches(IDEMPOTENCY_METADATA_KEY, key, since=since) if not is_dead(s)]
        return live[-1].batch_id if live else None  # the oldest: the one a later resend would compete with

    def _iter_batches(self, *, max_pages: int | None = None, since: float | None = None) -> Iterator[Any]:
        """Yield SDK batches, newest first: at most ``max_pages`` pages of 100, and none older than ``since``.

        Neither given: every batch of the organisation, page after page.
        """
        page = self._call("batch list", lambda: self.client.batches.list(limit=100))
        number = 0
        while True:
            for batch in page.data:
                if since is not None and batch.created_at and batch.created_at < since - CLOCK_SKEW_S:
                    return  # newest first: the rest is older still
                yield batch
            number += 1
            if number == max_pages or not page.has_next_page():
                return
            page = self._call("batch list (next page)", page.get_next_page)

    def find_batches(self, metadata_key: str, value: str, *, since: float | None = None) -> list[BatchState]:
        """Return the batches created since ``since`` (all without it) whose ``metadata[metadata_key] == value``.

        Newest first. Every page is read down to ``since``: a cap on pages would miss the key in
        an organisation that creates more batches than the cap between an intent and its retry.
        """
        return [
            state_from_openai(batch, self.provider)
            for batch in self._iter_batches(since=since)
            if (batch.metadata or {}).get(metadata_key) == value
        ]

    def iter_keyed_batches(self, since: float) -> Iterator[tuple[str, BatchState]]:
        """Yield ``(key, state)`` of the batches created since ``since`` whose metadata carries our key."""
        for batch in self._iter_batches(since=since):
            key = (batch.metadata or {}).get(IDEMPOTENCY_METADATA_KEY)
            if key:
                yield str(key), state_from_openai(batch, self.provider)

    def in_flight_tokens(self, model: str, *, max_pages: int = 10) -> int:
        """Sum the estimated input tokens of non-terminal batches for ``model`` (see ``token_budget``).

        Only batches whose metadata carries ``airflow_chunk_tokens`` count: batches created
        elsewhere are invisible to this gate (the provider's own refusal still covers them).
        """
        total = 0
        for batch in self._iter_batches(max_pages=max_pages):
            tokens = tokens_from_metadata(batch.metadata, model)
            if tokens is not None and not map_openai_status(batch.status, batch.id).is_terminal:
                total += tokens
        return total

    def find_existing(
        self, idempotency_key: str, chunk: ChunkDescriptor, *, since: float | None = None
    ) -> list[BatchState]:
        """Find batches whose metadata carries ``idempotency_key``, created since ``since`` (see submit_once)."""
        return self.find_batches(IDEMPOTENCY_METADATA_KEY, idempotency_key, since=since)

    def get_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state."""
        batch = self._call(f"status of batch {batch_id}", lambda: self.client.batches.retrieve(batch_id))
        return state_from_openai(batch, self.provider)

    async def aget_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state using the async client."""
        client = await self.aget_client()
        batch = await self._acall(f"status of batch {batch_id}", lambda: client.batches.retrieve(batch_id))
        return state_from_openai(batch, self.provider)

    async def alist_states(self) -> AsyncGenerator[list[BatchState], None]:
        """Yield pages of recent batches, newest first (``batches.list``, one call per page)."""
        client = await self.aget_client()
        page = await self._acall("batch list", lambda: client.batches.list(limit=self.list_page_size))
        while True:
            yield [state_from_openai(batch, self.provider) for batch in page.data]
            if not page.has_next_page():
                return
            page = await self._acall("batch list (next page)", page.get_next_page)

    def cancel(self, batch_id: str) -> BatchState:
        """Ask OpenAI to cancel the batch (it moves to ``cancelling``, then ``cancelled``)."""
        batch = self._call(f"cancel of batch {batch_id}", lambda: self.client.batches.cancel(batch_id))
        return state_from_openai(batch, self.provider)

    async def acancel(self, batch_id: str) -> BatchState:
        """Async twin of :meth:`cancel`."""
        client = await self.aget_client()
        batch = await self._acall(f"cancel of batch {batch_id}", lambda: client.batches.cancel(batch_id))
        return state_from_openai(batch, self.provider)

    def _stream_file_lines(self, file_id: str) -> Generator[bytes]:
        with self.client.files.with_streaming_response.content(file_id) as response:
            pending = b""
            for piece in response.iter_bytes(1 << 20):
                pending += piece
                lines = pending.split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        yield line
            if pending.strip():
                yield pending

    def iter_file_lines(self, file_id: str) -> Iterator[bytes]:
        """Stream a file's lines without loading it whole (blank lines skipped).

        A 429/5xx on opening or a connection that breaks mid-file reopens the file (with our
        retry policy) and skips the lines already yielded: none is lost, none comes twice.
        """
        return iter_with_restarts(
            lambda: self._stream_file_lines(file_id),
            what=f"download of file {file_id}",
            classify=self.classify_error,
            policy=self.retry_policy,
        )

    def iter_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Yield the parsed lines of the batch's output file, then of its error file."""
        for file_id in (state.output_file_id, state.error_file_id):
            if file_id:
                for line in self.iter_file_lines(file_id):
                    yield parse_openai_line(line)

    def iter_result_tables(self, state: BatchState, response_type: pa.DataType) -> Iterator[pa.Table]:
        """Yield the output file's results, then the error file's, as Arrow tables of up to 65,536 lines."""
        from airflow_batch_provider.results.table import join_lines, openai_result_table

        for file_id in (state.output_file_id, state.error_file_id):
            if file_id:
                for block in join_lines(self.iter_file_lines(file_id)):
                    yield openai_result_table(block, response_type)

    def iter_failed_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Yield the results of the lines that did not succeed, read from the error file alone.

        The output file holds only successes, so deciding what to retry never downloads the answers.
        """
        if state.error_file_id:
            for line in self.iter_file_lines(state.error_file_id):
                record = parse_openai_line(line)
                if record["status"] != "succeeded":
                    yield record

    def answer_now(self, request_lines: Sequence[bytes], *, model: str) -> list[bytes]:
        """POST each line's body, as it is, to its endpoint's real-time route (``/v1/chat/completions``...).

        The SDK's generic ``post`` rather than ``chat.completions.create(**body)``: the body is sent
        as the batch will carry it, whatever keys it holds. Answers come back as batch output lines
        (``{custom_id, response: {status_code, body}}``).
        """
        paths = {str(orjson.loads(line).get("url")).removeprefix("/v1") for line in request_lines}
        if paths - REALTIME_PATHS:
            raise NoRealtimeEndpointError(f"no real-time route is wired for endpoint(s) {sorted(paths)}")

        def send(request: dict[str, Any]) -> dict[str, Any]:
            path = str(request["url"]).removeprefix("/v1")
            return json_object(self.client.post(path, body=request["body"], cast_to=object))

        return self._answer_each(request_lines, send, _batch_output_line)

    def delete_file(self, file_id: str) -> None:
        """Delete an uploaded or result file."""
        self._call(f"delete of file {file_id}", lambda: self.client.files.delete(file_id))

    def batch_url(self, batch_id: str) -> str | None:
        """Link to the batch in the OpenAI platform console; None when the connection points elsewhere."""
        try:  # a link never fails a task: no connection or no key gives no link
            base_url = str(self.client.base_url)
        except (AirflowNotFoundException, openai.OpenAIError):
            return None
        return console_url(self.provider, base_url, batch_id)
