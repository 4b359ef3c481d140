"""GeminiBatchHook: Google's Gemini Batch API (Gemini Developer API) through the ``google-genai`` SDK.

Connection (type ``gemini``, default id ``gemini_default``): the API key in the password field;
the base URL (without ``/v1beta``) in the extra ``base_url`` or the host field, empty meaning
``https://generativelanguage.googleapis.com``. The SDK sends the key as ``x-goog-api-key``.

A batch is one uploaded JSONL file of ``{"key", "request"}`` lines (``files.upload``, resumable)
and one ``batches.create`` over it. Gemini batches carry no metadata, but they carry a display
name: it ends in the submission's idempotency key (``… [<key>]``), so after a crash between
"created" and "checkpointed" :meth:`find_existing` finds the batch by its name, exactly
(``exact_reconcile``). Results are one JSONL file (``dest.file_name``) downloaded to a temporary
file and read line by line, so a batch's answers never sit in memory whole.

The clients read the connection as every hook does (:mod:`~airflow_batch_provider.hooks.sdk_clients`)
and use the process's one TLS context; they are kept beside the hook, not in it, so ``vars(hook)``
and a pickled hook hold no API key.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import AsyncGenerator, Iterator, Mapping
from contextlib import suppress
from typing import Any, ClassVar

import orjson
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_batch_provider.backends.gemini import GEMINI_LIMITS
from airflow_batch_provider.backends.gemini.limits import API_VERSION, PROVIDER
from airflow_batch_provider.backends.gemini.results import parse_gemini_line
from airflow_batch_provider.backends.gemini.states import (
    DEAD,
    classify_gemini_error,
    state_from_gemini,
    with_operation,
)
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.hooks.base import IDEMPOTENCY_METADATA_KEY, BatchHook
from airflow_batch_provider.hooks.sdk_clients import connection_client_kwargs
from airflow_batch_provider.hooks.tls import shared_tls_context
from airflow_batch_provider.links import console_url
from airflow_batch_provider.status import BatchState, RequestCounts
from airflow_batch_provider.utils.http_logs import quiet_transport_logs
from airflow_batch_provider.utils.retry import RetryPolicy, acall_with_retries, call_with_retries
from airflow_batch_provider.utils.storage import to_path

PUBLIC_BASE_URL = "https://generativelanguage.googleapis.com"
_CUSTOM_ID_PREFIX = b'{"custom_id":'
_KEY_PREFIX = b'{"key":'
#: Seconds after which a failing create is not attempted again (the task fails; its retry reconciles).
CREATE_WITHIN = 180.0


def _transport() -> Any:
    """Return the HTTP library the SDK accepts clients of: httpx2 (as the other SDKs here) or httpx."""
    import importlib

    for name in ("httpx2", "httpx"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("google-genai needs httpx or httpx2")


#: SDK clients by hook, kept beside the hook rather than in it: a hook travels (pickled) with
#: operators and triggers and lands in tracebacks' locals, and a client holds the API key.
_CLIENTS: weakref.WeakKeyDictionary[GeminiBatchHook, Any] = weakref.WeakKeyDictionary()
#: Async clients by hook: (``client.aio``, the httpx async client handed to it).
_ASYNC_CLIENTS: weakref.WeakKeyDictionary[GeminiBatchHook, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def key_line(line: bytes, path: str, number: int) -> bytes:
    """Return a chunk-file line with its leading ``custom_id`` renamed to the batch API's ``key``."""
    if not line.startswith(_CUSTOM_ID_PREFIX):
        raise InvalidInputError(
            f"{path}, line {number}: not a Gemini request line starting with custom_id; "
            "rebuild the chunk with ChunkOperator(provider='gemini')."
        )
    return _KEY_PREFIX + line[len(_CUSTOM_ID_PREFIX) :]


def display_name(metadata: Mapping[str, str], label: str) -> str:
    """Return the batch's display name: DAG and chunk for people, ``[<idempotency key>]`` for :meth:`find_existing`."""
    key = metadata[IDEMPOTENCY_METADATA_KEY]
    dag = metadata.get("airflow_dag_id", "")[:40]
    return f"{dag} {label[:44]} [{key}]".strip()  # at most 128 characters with a 40-character key


class GeminiBatchHook(BatchHook):
    """Submit chunk files as Gemini batch jobs, poll, cancel and read their result files.

    :param conn_id: Airflow connection id (type ``gemini``).
    :param retry_policy: attempts above the SDK's own for every API call.
    :param timeout: per-request timeout in seconds.
    """

    conn_name_attr = "conn_id"
    default_conn_name: ClassVar[str] = "gemini_default"
    list_page_size: ClassVar[int] = 100  # one list call answers up to 100 waiting batches
    lists_keys: ClassVar[bool] = True  # listed states carry the key (BatchState.key)
    conn_type = "gemini"
    hook_name = "Google Gemini Batch API"

    provider: ClassVar[str] = PROVIDER
    limits: ClassVar[ProviderLimits] = GEMINI_LIMITS
    exact_reconcile: ClassVar[bool] = True

    def __init__(
        self, conn_id: str | None = None, *, retry_policy: RetryPolicy | None = None, timeout: float = 600.0
    ) -> None:
        super().__init__(conn_id)
        self.retry_policy = retry_policy or RetryPolicy()
        self.timeout = timeout

    # -- clients (kept out of the hook's own state: see _CLIENTS) --------------------------------
    def client_kwargs(self, conn: Any) -> dict[str, Any]:
        """Return ``genai.Client`` arguments from the connection (raise when it has no API key)."""
        from google.genai import types

        quiet_transport_logs()
        # The base URL and key as every hook reads them (hooks/sdk_clients.py); the SDK retries nothing
        # itself, our retry policy does, and the timeout goes in its HttpOptions (milliseconds).
        shared = connection_client_kwargs(conn, max_retries=0, timeout=self.timeout)
        if not shared["api_key"]:
            raise InvalidInputError(
                f"Connection {self.conn_id!r} has no API key: put the Gemini API key in its password field."
            )
        # Our own HTTP clients over the process's shared TLS context (hooks/tls.py). Handing the SDK an
        # httpx async client also keeps it off aiohttp, where it opens one session per event loop.
        transport = _transport()
        http = {"verify": shared_tls_context(), "timeout": self.timeout, "follow_redirects": True}
        options = types.HttpOptions(
            base_url=shared["base_url"],
            api_version=API_VERSION,
            timeout=int(self.timeout * 1000),
            httpx_client=transport.Client(**http),
            httpx_async_client=transport.AsyncClient(**http),
        )
        return {"api_key": shared["api_key"], "http_options": options}

    @property
    def client(self) -> Any:
        """The SDK client (``google.genai.Client``), built once per hook from the connection."""
        client = _CLIENTS.get(self)
        if client is None:
            from google import genai

            client = _CLIENTS[self] = genai.Client(**self.client_kwargs(self.get_connection(self.conn_id)))
        return client

    def get_conn(self) -> Any:
        """Return the SDK client."""
        return self.client

    async def aget_client(self) -> Any:
        """Return the SDK's async client (``client.aio``), the connection read without blocking the loop."""
        opened = _ASYNC_CLIENTS.get(self)
        if opened is None:
            import asyncio

            from google import genai

            conn = await self.aget_connection(self.conn_id)
            kwargs = await asyncio.to_thread(self.client_kwargs, conn)  # loads nothing on the loop
            opened = _ASYNC_CLIENTS[self] = (genai.Client(**kwargs).aio, kwargs["http_options"].httpx_async_client)
        return opened[0]

    async def aclose(self) -> None:
        """Close the async client this hook opened, and the HTTP client it was given."""
        opened = _ASYNC_CLIENTS.pop(self, None)
        if opened is not None:
            client, http = opened
            await client.aclose()
            await http.aclose()

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        return call_with_retries(fn, what=what, classify=classify_gemini_error, policy=self.retry_policy, **kwargs)

    # -- submit ----------------------------------------------------------------------------------
    def upload_file(self, path: str, *, chunk_label: str = "") -> str:
        """Upload a chunk file (``custom_id`` renamed to ``key`` on the way) with the File API; return ``files/…``."""
        source = to_path(path)
        handle, local = tempfile.mkstemp(prefix="gemini-batch-", suffix=".jsonl")
        try:
            with os.fdopen(handle, "wb") as out, source.open("rb") as lines:
                for number, line in enumerate(lines, 1):
                    if line.strip():
                        out.write(key_line(line, path, number))
            config = {"mime_type": "application/jsonl", "display_name": (chunk_label or source.name)[:128]}
            uploaded = self._call(
                f"upload of {chunk_label or path}", lambda: self.client.files.upload(file=local, config=config)
            )
        finally:
            with suppress(OSError):
                os.unlink(local)
        return str(uploaded.name)

    def create_batch(self, chunk: ChunkDescriptor, *, input_file_id: str | None, metadata: Mapping[str, str]) -> str:
        """Create a batch job over the uploaded file; its display name carries the idempotency key."""
        if not input_file_id:
            raise ValueError(f"{chunk['label']}: a Gemini batch needs an uploaded file (see upload_file)")
        name = display_name(metadata, chunk["label"])
        key = metadata.get(IDEMPOTENCY_METADATA_KEY)
        batch_id = self._call(
            f"{chunk['label']}: batch create for file {input_file_id}",
            lambda: str(
                self.client.batches.create(model=chunk["model"], src=input_file_id, config={"display_name": name}).name
            ),
            within=CREATE_WITHIN,
            # A failed create may have made the batch (its answer lost): look its name up before resending.
            recover=lambda exc: self._landed(key),
        )
        self.log.info("%s: created Gemini batch %s from file %s", chunk["label"], batch_id, input_file_id)
        return batch_id

    def _landed(self, key: str | None) -> str | None:
        """Return the name of a batch whose display name carries ``key`` (None: resend the create).

        A batch that already succeeded is the chunk's own too (it may finish within the retry
        wait): only a failed, expired or cancelled one is not adopted, as OpenAI's hook does.
        """
        if not key:
            return None
        mine = [job for job in self.find_batches(f"[{key}]") if state_from_gemini(job).status not in DEAD]
        return str(mine[-1].name) if mine else None

    def find_batches(self, suffix: str, *, max_pages: int = 10) -> list[Any]:
        """Return recent SDK batch jobs whose display name ends in ``suffix``, newest first."""
        pager = self._call("batch list", lambda: self.client.batches.list(config={"page_size": 100}))
        found: list[Any] = []
        for page_number in range(max_pages):
            found.extend(job for job in pager.page if (job.display_name or "").endswith(suffix))
            if page_number + 1 == max_pages or not pager.config.get("page_token"):
                break
            self._call("batch list (next page)", pager.next_page)
        return sorted(found, key=lambda job: job.create_time.timestamp() if job.create_time else 0.0, reverse=True)

    def iter_keyed_batches(self, since: float) -> Iterator[tuple[str, BatchState]]:
        """Yield ``(key, state)`` of the batches created since ``since`` whose display name ends in ``[<key>]``."""
        pager = self._call("batch list", lambda: self.client.batches.list(config={"page_size": 100}))
        while True:
            for job in pager.page:
                state = state_from_gemini(job)
                created = job.create_time.timestamp() if job.create_time else since
                if created >= since and state.key:
                    yield state.key, state
            if not pager.config.get("page_token"):
                return
            self._call("batch list (next page)", pager.next_page)

    def find_existing(
        self, idempotency_key: str, chunk: ChunkDescriptor, *, since: float | None = None
    ) -> list[BatchState]:
        """Find batches whose display name ends in ``[<idempotency_key>]`` (see :func:`display_name`)."""
        jobs = self.find_batches(f"[{idempotency_key}]")
        return [state_from_gemini(job, counts=RequestCounts(total=chunk["num_requests"])) for job in jobs]

    # -- wait and cancel -------------------------------------------------------------------------
    def get_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state."""
        job = self._call(f"status of batch {batch_id}", lambda: self.client.batches.get(name=batch_id))
        state = state_from_gemini(job)
        if not state.status.is_terminal:
            return state
        # The SDK's BatchJob has no batchStats or error for the Developer API: read the resource raw, once, at the end.
        raw = self._call(f"counts of batch {batch_id}", lambda: self.client._api_client.request("get", batch_id, {}))
        return with_operation(state, orjson.loads(raw.body or "{}"))

    async def aget_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state using the async client."""
        client = await self.aget_client()
        job = await acall_with_retries(
            lambda: client.batches.get(name=batch_id),
            what=f"status of batch {batch_id}",
            classify=classify_gemini_error,
            policy=self.retry_policy,
        )
        state = state_from_gemini(job)
        if not state.status.is_terminal:
            return state
        raw = await acall_with_retries(
            lambda: client._api_client.async_request("get", batch_id, {}),
            what=f"counts of batch {batch_id}",
            classify=classify_gemini_error,
            policy=self.retry_policy,
        )
        return with_operation(state, orjson.loads(raw.body or "{}"))

    async def alist_states(self) -> AsyncGenerator[list[BatchState], None]:
        """Yield pages of recent batches (``batches.list``, one call per page), running ones only.

        A listed job has no request counts: an ended one is left out, and the poller retrieves it
        (:meth:`aget_state` reads its counts once, at the end).
        """
        client = await self.aget_client()
        pager = await acall_with_retries(
            lambda: client.batches.list(config={"page_size": self.list_page_size}),
            what="batch list",
            classify=classify_gemini_error,
            policy=self.retry_policy,
        )
        while True:
            states = [state_from_gemini(job) for job in pager.page]
            yield [state for state in states if not state.status.is_terminal]
            if not pager.config.get("page_token"):
                return
            await acall_with_retries(
                pager.next_page, what="batch list (next page)", classify=classify_gemini_error, policy=self.retry_policy
            )

    def cancel(self, batch_id: str) -> BatchState:
        """Ask Gemini to cancel the batch (the SDK's cancel answers nothing), then return its state."""
        self._call(f"cancel of batch {batch_id}", lambda: self.client.batches.cancel(name=batch_id))
        return self.get_state(batch_id)

    async def acancel(self, batch_id: str) -> BatchState:
        """Async twin of :meth:`cancel`."""
        client = await self.aget_client()
        await acall_with_retries(
            lambda: client.batches.cancel(name=batch_id),
            what=f"cancel of batch {batch_id}",
            classify=classify_gemini_error,
            policy=self.retry_policy,
        )
        return await self.aget_state(batch_id)

    def batch_url(self, batch_id: str) -> str | None:
        """Link to the batch in Google AI Studio; None when the connection points anywhere but Google's API."""
        try:  # a link never fails a task: no connection gives no link
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            return None
        base_url = connection_client_kwargs(conn, max_retries=0, timeout=self.timeout)["base_url"]
        return console_url(PROVIDER, base_url or PUBLIC_BASE_URL, batch_id)

    # -- results ---------------------------------------------------------------------------------
    def download_results(self, file_name: str, destination: str) -> None:
        """Download a result file to ``destination`` (streamed to disk; a failed download starts over)."""
        self._call(
            f"download of {file_name}", lambda: self.client.files.download(file=file_name, destination=destination)
        )

    def iter_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Yield the parsed lines of the batch's result file (nothing when the batch ended without one)."""
        if not state.output_file_id:
            return
        handle, local = tempfile.mkstemp(prefix="gemini-results-", suffix=".jsonl")
        os.close(handle)
        try:
            self.download_results(state.output_file_id, local)
            with open(local, "rb") as lines:
                for line in lines:
                    if line.strip():
                        yield parse_gemini_line(line)
        finally:
            with suppress(OSError):
                os.unlink(local)
