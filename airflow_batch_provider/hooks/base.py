"""The one small interface every batch backend implements.

Operators, the sensor and the trigger only talk to this interface; provider SDKs are
imported by the concrete hooks alone. Adding a backend (AWS Bedrock, say) means one hook
subclass and one status-mapping function.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseHook

from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.descriptors import ChunkDescriptor, ResultRecord, SubmittedBatch
from airflow_batch_provider.status import BatchState

if TYPE_CHECKING:
    import pyarrow as pa


class BatchHook(BaseHook, ABC):
    """Submit a chunk file as a provider batch, watch it, cancel it and read its results."""

    provider: ClassVar[str]
    limits: ClassVar[ProviderLimits]
    default_conn_name: ClassVar[str]
    # True when find_existing matches on a key the provider stores (safe to cancel extra matches).
    exact_reconcile: ClassVar[bool] = False
    _async_client: Any = None  # the async SDK client, once opened (see aclose)

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.conn_id = conn_id or self.default_conn_name

    @abstractmethod
    def submit(self, chunk: ChunkDescriptor, *, metadata: Mapping[str, str]) -> SubmittedBatch:
        """Upload the chunk's requests and create one batch; return the chunk plus its batch id."""

    @abstractmethod
    def get_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state (blocking call)."""

    @abstractmethod
    async def aget_state(self, batch_id: str) -> BatchState:
        """Return the batch's current state without blocking the event loop."""

    @abstractmethod
    def cancel(self, batch_id: str) -> BatchState:
        """Ask the provider to cancel the batch; return the state it reports."""

    @abstractmethod
    def iter_results(self, state: BatchState) -> Iterator[ResultRecord]:
        """Yield every result of a terminal batch, streamed, in the provider's (arbitrary) order."""

    def iter_result_tables(self, state: BatchState, response_type: pa.DataType) -> Iterator[pa.Table]:
        """Yield the results of a terminal batch as Arrow tables (:mod:`~airflow_batch_provider.results.table`).

        ``response_type`` is the ``response`` column's type (text, or a float list for embeddings).
        The default builds them from :meth:`iter_results`; hooks whose results come in the OpenAI
        batch output format read blocks of lines straight into columns instead.
        """
        from airflow_batch_provider.results.table import iter_record_tables

        return iter_record_tables(self.iter_results(state), response_type)

    async def aclose(self) -> None:
        """Close the async SDK client this hook opened (in the event loop that opened it).

        Left open, an SDK closes its client when it is garbage collected, on whatever loop runs
        then: under ``airflow dags test`` (a fresh loop per trigger) that fails with "Event loop is
        closed", logged as an error; in a triggerer the connection pool lingers. The provider
        hooks keep their client in ``_async_client``; a hook without one has nothing to close.
        """
        client = getattr(self, "_async_client", None)
        if client is not None:
            self._async_client = None
            await client.close()

    def find_existing(
        self, idempotency_key: str, chunk: ChunkDescriptor, *, since: float | None = None
    ) -> list[BatchState]:
        """Return batches already created for ``idempotency_key`` (newest first), for crash recovery.

        Used when a submission intent was recorded but its batch id was not: the batch may exist.
        ``since`` is the epoch time the intent was recorded (providers without batch metadata
        match on creation time and request count). The default finds nothing.
        """
        return []

    def batch_url(self, batch_id: str) -> str | None:
        """Return a link to the batch in the provider's console, when there is one."""
        return None


def hook_class_for(provider: str) -> type[BatchHook]:
    """Return the hook class that serves ``provider`` (imported lazily)."""
    from airflow_batch_provider.exceptions import InvalidInputError

    if provider == "openai":
        from airflow_batch_provider.hooks.openai_batch import OpenAIBatchHook

        return OpenAIBatchHook
    if provider == "anthropic":
        from airflow_batch_provider.hooks.anthropic_batch import AnthropicBatchHook

        return AnthropicBatchHook
    if provider in ("vllm", "server"):  # self-hosted: results are local files in the OpenAI output format
        from airflow_batch_provider.hooks.local_results import RESULTS_HOOKS

        return RESULTS_HOOKS[provider]
    raise InvalidInputError(
        f"Unknown provider {provider!r}; choose 'openai' or 'anthropic' (batch APIs), "
        "or 'vllm' or 'server' (self-hosted)."
    )


def get_batch_hook(provider: str, conn_id: str | None = None, **kwargs: Any) -> BatchHook:
    """Build the hook for ``provider`` on ``conn_id`` (the hook's default connection when None)."""
    return hook_class_for(provider)(conn_id=conn_id, **kwargs)
