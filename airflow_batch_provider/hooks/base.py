"""BatchHook: the run-time half of the contract between this provider and a batch backend.

Operators, the sensor and the trigger only call what is declared here; provider SDKs are
imported by the concrete hooks alone. A backend's hook implements the abstract methods and
overrides the defaults that do not fit it; nothing else is looked up at run time. The other half
(request lines, checks, limits, prices, links) is :class:`~airflow_batch_provider.backends.base.Backend`;
:mod:`airflow_batch_provider.hooks.registry` turns a provider name into its hook.

Life of one chunk, and the methods each step calls:

1. submit (SubmitBatchOperator, and the sensor's follow-up batches): :meth:`find_existing`
   (crash recovery), :meth:`upload_file` (skipped by backends that take requests inline),
   :meth:`create_batch`; with ``token_budget``, :meth:`in_flight_tokens` when
   :attr:`~BatchHook.supports_token_budget`.
2. wait (BatchCompleteTrigger on the triggerer, BatchCompleteSensor when poking):
   :meth:`aget_state` / :meth:`get_state`; :meth:`alist_states` when :attr:`~BatchHook.list_page_size`
   is set and several batches of one connection wait in one triggerer (one list call answers them
   all: :mod:`airflow_batch_provider.triggers.poller`); :meth:`acancel` / :meth:`cancel` when a task
   is killed; :meth:`aclose` when the trigger ends.
3. line retries (the sensor): :meth:`iter_failed_results`, then :meth:`iter_results` when lines
   have no result at all.
4. merge (MergeResultsOperator): :meth:`iter_result_tables`.

Before all of them, the chunk step's pre-flight canary (:mod:`airflow_batch_provider.batches.canary`)
calls :meth:`answer_now` on a few request lines.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord, SubmittedBatch
from airflow_batch_provider.status import BatchState

if TYPE_CHECKING:
    import pyarrow as pa

#: The batch metadata key that carries a submission's idempotency key (see :meth:`BatchHook.find_existing`).
IDEMPOTENCY_METADATA_KEY = "airflow_idempotency_key"


class NoRealtimeEndpointError(NotImplementedError):
    """Raised by :meth:`BatchHook.answer_now` of a backend that sends nothing through a real-time API."""


class BatchHook(BaseHook, ABC):
    """Submit a chunk file as a provider batch, watch it, cancel it and read its results.

    Class attributes a backend sets: ``provider`` (its backend's name, also written in chunk
    descriptors), ``limits`` (requests and bytes per batch), ``default_conn_name``; and, when
    they hold, ``exact_reconcile`` and ``supports_token_budget``.
    """

    provider: ClassVar[str]
    limits: ClassVar[ProviderLimits]
    default_conn_name: ClassVar[str]
    #: True when find_existing matches on a key the provider stores (safe to cancel extra matches).
    exact_reconcile: ClassVar[bool] = False
    #: True when batches carry metadata and the provider caps enqueued tokens: in_flight_tokens works.
    supports_token_budget: ClassVar[bool] = False
    #: Batches one page of :meth:`alist_states` holds; 0 (the default) when the backend lists none.
    list_page_size: ClassVar[int] = 0
    #: True when :meth:`alist_states` fills each state's ``key`` with the idempotency key the batch carries:
    #: then the shared poller names a waiting batch's same-key siblings and the sensor need not list again.
    lists_keys: ClassVar[bool] = False
    _async_client: Any = None  # the async SDK client, once opened (see aclose)

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name

    # -- submit ------------------------------------------------------------------------------------
    def upload_file(self, path: str, *, chunk_label: str = "") -> str | None:
        """Upload a chunk's requests file ahead of :meth:`create_batch`; return the provider's file id.

        The submission checkpoints the id between the two calls, so a retry reuses the upload.
        The default returns None: the backend has no separate upload step and
        :meth:`create_batch` reads the requests file itself.
        """
        return None

    @abstractmethod
    def create_batch(self, chunk: ChunkDescriptor, *, input_file_id: str | None, metadata: Mapping[str, str]) -> str:
        """Create one batch of the chunk's requests; return its batch id.

        ``input_file_id`` is what :meth:`upload_file` returned (None without an upload step).
        ``metadata`` holds :data:`IDEMPOTENCY_METADATA_KEY` and friends; a backend that can store
        it on the batch should (that is what makes :meth:`find_existing` exact).
        """

    def submit(self, chunk: ChunkDescriptor, *, metadata: Mapping[str, str]) -> SubmittedBatch:
        """Upload (when the backend has that step) and create the chunk's batch in one go, without checkpoints.

        SubmitBatchOperator does not call this: it checkpoints between the two steps.
        """
        file_id = self.upload_file(chunk["requests_path"], chunk_label=chunk["label"])
        batch_id = self.create_batch(chunk, input_file_id=file_id, metadata=metadata)
        return {**chunk, "batch_id": batch_id, "input_file_id": file_id}

    def find_existing(
        self, idempotency_key: str, chunk: ChunkDescriptor, *, since: float | None = None
    ) -> list[BatchState]:
        """Return batches already created for ``idempotency_key`` (newest first), for crash recovery.

        Used when a submission intent was recorded but its batch id was not: the batch may exist.
        ``since`` is the epoch time the intent was recorded (providers without batch metadata
        match on creation time and request count). The default finds nothing.
        """
        return []

    def iter_keyed_batches(self, since: float) -> Iterator[tuple[str, BatchState]]:
        """Yield ``(idempotency key, state)`` of every batch created since ``since`` that carries one of our keys.

        For ``python -m airflow_batch_provider.jobs reconcile``, which looks for late creates after
        the runs ended. The default yields nothing: the backend stores no key it can list by.
        """
        return iter(())

    def iter_unkeyed_batches(self, since: float) -> Iterator[BatchState]:
        """Yield every batch created since ``since``, for a backend that stores no key (``exact_reconcile`` False).

        ``jobs reconcile`` tells whose they are from their results' custom ids. Default: nothing.
        """
        return iter(())

    def owns(self, state: BatchState, chunk: ChunkDescriptor) -> bool | None:
        """Say whether a batch :meth:`find_existing` returned is ``chunk``'s own: True, False, or None (not yet known).

        A hook with ``exact_reconcile`` matched a stored key: True. One that matched on a guess
        (size and time) must prove it from what the batch holds, which may only be readable once
        it ended; the default cannot prove anything (None), and an unproven batch is adopted at
        most provisionally (see :func:`~airflow_batch_provider.batches.submission.submit_once`).
        """
        return True if self.exact_reconcile else None

    def in_flight_tokens(self, model: str) -> int:
        """Return the input tokens of this deployment's non-terminal batches for ``model``.

        Called only when :attr:`supports_token_budget` is True (the default raises).
        """
        raise NotImplementedError(f"the {self.provider} backend does not count enqueued tokens")

    def answer_now(self, request_lines: Sequence[bytes], *, model: str) -> list[bytes]:
        """Send request lines of a chunk file (of ``model``) through the provider's real-time API, one call each.

        Return one line per request, in order, shaped like a line of the provider's batch results
        (what the backend's ``parse_result`` reads): an answer or an error the API gave becomes a
        result line, never an exception. For the pre-flight canary (a few lines, billed at
        real-time prices). ``model`` is the chunk's: the lines of some providers do not name it
        (Bedrock's, Gemini's). The default raises :class:`NoRealtimeEndpointError`.
        """
        raise NoRealtimeEndpointError(f"the {self.provider} backend has no real-time call in this provider yet")

    # -- wait and cancel ------------------------------------------------------------------------
    @abstractmethod
    def get_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state (blocking call)."""

    @abstractmethod
    async def aget_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state without blocking the event loop."""

    def alist_states(self) -> AsyncGenerator[list[BatchState], None]:
        """Yield pages of this connection's batches, newest first (one list call per page), without blocking.

        Each state must be as complete as :meth:`aget_state`'s for the same batch: a backend whose
        list leaves something out (Gemini's counts of an ended batch) omits those batches, and the
        poller retrieves them one by one. Only called when :attr:`list_page_size` is set; the
        default raises.
        """
        raise NotImplementedError(f"the {self.provider} backend does not list its batches")

    @abstractmethod
    def cancel(self, batch_id: str) -> BatchState:
        """Ask the provider to cancel the batch; return the state it reports."""

    async def acancel(self, batch_id: str) -> BatchState:
        """Async twin of :meth:`cancel`; the default runs :meth:`cancel` in a worker thread."""
        return await asyncio.to_thread(self.cancel, batch_id)

    async def aclose(self) -> None:
        """Close the async SDK client this hook opened (in the event loop that opened it).

        Left open, an SDK closes its client when it is garbage collected, on whatever loop runs
        then: under ``airflow dags test`` (a fresh loop per trigger) that fails with "Event loop is
        closed", logged as an error; in a triggerer the connection pool lingers. The default
        closes ``_async_client`` (where the provider hooks keep theirs); a hook without one has
        nothing to close.
        """
        client, self._async_client = self._async_client, None
        if client is not None:
            await client.close()

    def batch_url(self, batch_id: str) -> str | None:
        """Return a link to the batch in the provider's console, when there is one."""
        return None

    # -- results ----------------------------------------------------------------------------------
    @abstractmethod
    def iter_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Yield every result of a terminal batch, streamed, in the provider's (arbitrary) order."""

    def iter_failed_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Yield at least every result of a terminal batch that did not succeed (to decide line retries).

        The default yields every result (callers skip the successes); a backend that keeps
        failures apart (OpenAI's error file) reads only those.
        """
        return self.iter_results(state)

    def iter_result_tables(self, state: BatchState, response_type: pa.DataType) -> Iterator[pa.Table]:
        """Yield the results of a terminal batch as Arrow tables (:mod:`~airflow_batch_provider.results.table`).

        ``response_type`` is the ``response`` column's type (text, or a float list for embeddings).
        The default builds them from :meth:`iter_results`; hooks whose results come in the OpenAI
        batch output format read blocks of lines straight into columns instead.
        """
        from airflow_batch_provider.results.table import iter_record_tables

        return iter_record_tables(self.iter_results(state), response_type)
