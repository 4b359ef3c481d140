"""SubmitBatchOperator: one mapped task per chunk that turns a chunk file into a provider batch.

Submission is checkpointed so that a retry, a crash or a worker loss never creates a
second batch for the same chunk (see :mod:`airflow_batch_provider.batches.submission`).

With ``token_budget`` the operator also keeps the input tokens enqueued per model under a
budget before creating a batch (see :mod:`airflow_batch_provider.batches.token_budget`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.submission import (
    batch_metadata,
    chunk_input_tokens,
    idempotency_key,
    submit_once,
    task_ids,
)
from airflow_batch_provider.batches.token_budget import BudgetCheck, budget_for, check_budget_value, token_metadata
from airflow_batch_provider.descriptors import ChunkDescriptor, SubmittedBatch, descriptor_argument
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.links import BatchConsoleLink, remember_batch_url
from airflow_batch_provider.metrics import BatchMetrics

CHECKPOINT_KEY = "batch_submission"


class SubmitBatchOperator(BaseOperator):
    """Upload one chunk file and create its provider batch; return the chunk plus ``batch_id``.

    Map it over ChunkOperator's output::

        SubmitBatchOperator.partial(task_id="submit", conn_id="openai_batch_default").expand(chunk=chunks.output)

    :param chunk: a chunk descriptor from ChunkOperator.
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param provider: override the provider named in the chunk descriptor (empty: the chunk's). Templated.
    :param metadata: extra batch metadata (OpenAI only; ≤ 9 pairs: we add up to 7 of our own).
        Two of ours record the chunk's input tokens and model (ChunkOperator's estimate, see
        :func:`chunk_input_tokens`), which token budgets count.
    :param token_budget: input tokens allowed in flight per model (OpenAI's enqueued-token cap):
        an int for every model or a ``{model: tokens}`` map. Before creating a batch the operator
        sums the tokens of this deployment's non-terminal batches of the same model and, while
        this chunk would pass the budget, waits deferred. None (default): no gate.
    :param token_budget_poll_interval: seconds between budget checks while waiting.
    :param token_budget_max_wait: seconds to wait for room before submitting anyway (the
        sensor then waits out a ``token_limit_exceeded`` refusal and resubmits).
    """

    # Not `chunk`: it comes from XCom (which Airflow never renders), and as a template field its rendered
    # copy would be stored again for every task instance (~1.4 KB per chunk; docs/performance.md).
    template_fields: Sequence[str] = ("conn_id", "provider", "metadata")
    ui_color = "#e8f1ff"
    operator_extra_links = (BatchConsoleLink(),)

    def __init__(
        self,
        *,
        chunk: ChunkDescriptor | dict[str, Any],
        conn_id: str | None = None,
        provider: str | None = None,
        metadata: Mapping[str, str] | None = None,
        token_budget: int | Mapping[str, int] | None = None,
        token_budget_poll_interval: float = 60.0,
        token_budget_max_wait: float = 6 * 3600.0,
        map_index_template: str | None = "{{ task.chunk['label'] }}",
        **kwargs: Any,
    ) -> None:
        # A signature default (not kwargs.setdefault) so that .partial() picks it up for mapped tasks.
        super().__init__(map_index_template=map_index_template, **kwargs)
        self.chunk = descriptor_argument(chunk, task_id=self.task_id, argument="chunk", operator=type(self).__name__)
        self.conn_id = conn_id
        self.provider = provider
        self.metadata = dict(metadata or {})
        self.token_budget = check_budget_value(token_budget)
        self.token_budget_poll_interval = float(token_budget_poll_interval)
        self.token_budget_max_wait = float(token_budget_max_wait)
        self._budget_wait_since: float | None = None

    @cached_property
    def hook(self) -> BatchHook:
        """The provider hook of this chunk, built once per task run (tests may assign it)."""
        return get_batch_hook(self.provider or self.chunk["provider"], self.conn_id)

    def execute(self, context: Context) -> SubmittedBatch:
        """Submit the chunk once, or reattach to the batch an earlier attempt created."""
        chunk: ChunkDescriptor = self.chunk  # type: ignore[assignment]
        if chunk["num_requests"] == 0:  # every row unchanged (skip_unchanged): nothing to send, nothing to pay
            self.log.info("%s: no requests to send; the merge uses the stored results", chunk["label"])
            return {**chunk, "batch_id": ""}
        hook = self.hook
        dag_id, run_id, map_index = task_ids(context, str(self.dag_id))
        key = idempotency_key(dag_id, self.key_scope(run_id), self.task_id, map_index, chunk["fingerprint"])
        metadata = batch_metadata(self.metadata, key, dag_id, run_id, f"{self.task_id}[{map_index}]", chunk["label"])
        metrics = BatchMetrics.from_context(context, provider=chunk["provider"], model=chunk["model"])
        submitted = submit_once(
            hook,
            chunk,
            checkpoint=Checkpoint(context, CHECKPOINT_KEY),
            key=key,
            metadata=metadata,
            log=self.log,
            prepare=lambda: self._prepare(chunk),
            metrics=metrics,
            key_since=self.key_since(context),
            first_try=self.first_try(context),
        )
        self.log.info("%s: %d requests in batch %s", chunk["label"], chunk["num_requests"], submitted["batch_id"])
        remember_batch_url(self, hook.batch_url(submitted["batch_id"]))
        metrics.requests_in_flight(chunk["num_requests"], chunk_index=chunk["chunk_index"])
        return submitted

    def key_scope(self, run_id: str) -> str:
        """Return what the idempotency key is scoped to beside the DAG, task and chunk: the run (subclasses: more)."""
        return run_id

    def key_since(self, context: Context) -> float | None:
        """Return a time before any batch with this task's key can exist: the run's first start (None: unknown).

        The key names the run, so its batches are younger than the run. A run that was cleared may
        have had its start date reset after its first batches: then it is unknown, and a retry that
        finds no checkpoint reads the provider's whole batch list (a subclass whose key outlives the
        run returns None).
        """
        dag_run = context.get("dag_run")
        if dag_run is None or dag_run.start_date is None or dag_run.clear_number:
            return None
        return float(dag_run.start_date.timestamp())

    def first_try(self, context: Context) -> bool:
        """True on the first try of a run never cleared: no batch with this task's key can exist yet.

        A clear starts a new try (and counts in the run's ``clear_number``), a crash a retry: then
        the provider is asked before creating. A subclass whose key outlives the run returns False.
        """
        ti, dag_run = context.get("ti"), context.get("dag_run")
        if ti is None or dag_run is None:
            return False
        return ti.try_number == 1 and not dag_run.clear_number and self.key_since(context) is not None

    def resume_after_budget_wait(
        self, context: Context, event: Any = None, budget_wait_since: float | None = None
    ) -> SubmittedBatch:
        """Check the token budget again after a deferred wait (the trigger fired)."""
        self._budget_wait_since = budget_wait_since
        return self.execute(context)

    def _prepare(self, chunk: ChunkDescriptor) -> dict[str, str]:
        """Record the chunk's tokens in the metadata and wait (deferred) while the token budget is full."""
        hook = self.hook
        if not hook.supports_token_budget:
            if self.token_budget is not None:
                self.log.info("%s: provider %s has no enqueued-token cap; token_budget is not checked",
                              chunk["label"], hook.provider)  # fmt: skip
            return {}
        tokens = chunk_input_tokens(chunk)
        extra = token_metadata(tokens, chunk["model"])
        budget = budget_for(self.token_budget, chunk["model"])
        if budget is None:
            return extra
        check = BudgetCheck(tokens=tokens, in_flight=hook.in_flight_tokens(chunk["model"]), budget=budget)
        self.log.info("%s: token budget: %s", chunk["label"], check.describe(chunk["model"]))
        if check.fits:
            return extra
        since = self._budget_wait_since or time.time()
        waited = time.time() - since
        if waited >= self.token_budget_max_wait:
            self.log.warning(
                "%s: waited %.0f s for room in the token budget; submitting anyway (a token_limit_exceeded "
                "refusal is waited out by the sensor)",
                chunk["label"],
                waited,
            )
            return extra
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        self.log.info(
            "%s: waiting %.0f s for room in the token budget", chunk["label"], self.token_budget_poll_interval
        )
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=self.token_budget_poll_interval)),
            method_name="resume_after_budget_wait",
            kwargs={"budget_wait_since": since},
        )
        raise AssertionError("unreachable")  # pragma: no cover  (defer raises TaskDeferred)

    def on_kill(self) -> None:
        """Nothing to cancel here: the batch id is checkpointed and the sensor owns cancellation."""
