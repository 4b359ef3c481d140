"""BatchCompleteSensor: wait for a chunk's provider batch to end, resend what failed, deferred by default.

While deferred no worker slot is held: the async trigger polls on the triggerer. When a batch
ends, the sensor decides:

- ``completed`` or ``expired``: the lines that failed for a passing reason (HTTP 429/5xx,
  server errors, expired lines, lines with no result) go out again as a follow-up batch of
  only those lines (see :mod:`airflow_batch_provider.batches.line_retry`), up to ``max_line_retries``
  times; each follow-up is checkpointed like a submission, so a retried task reattaches to it.
  Expiry never raises here: what finished is kept, what expired is retried, and whatever still
  failed after the last attempt is judged by MergeResultsOperator's ``max_failure_ratio``.
- ``failed`` with only ``token_limit_exceeded`` (OpenAI's enqueued-token cap): the same lines are
  submitted again after ``token_limit_retry_interval`` seconds, for up to ``token_limit_max_wait``.
- ``failed`` otherwise (validation): BatchFailedError with the provider's line-level codes.
- ``cancelled`` by someone else (a person, the provider): BatchCancelledError, nothing resubmitted —
  a cancel is a decision, not a fault. Cancelled by this pipeline (task killed or timed out, with
  ``cancel_on_kill``; recorded first in the task state store and, from the triggerer, as a marker
  under ``job_dir/retries/cancelled/``): that run ends with BatchCancelledError/BatchTimeoutError,
  and a later run of the task (cleared, or retried after a timeout) sends the same lines again.

The result is the chunk descriptor plus ``state`` (the first attempt's BatchState dict, as
before) and ``attempts`` (every attempt's BatchState dict, in order), which
MergeResultsOperator reads in order, the last result per custom_id winning.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any, cast

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowTaskTimeout

from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.line_retry import (
    DEFAULT_MAX_LINE_RETRIES,
    cancelled_by_us,
    mark_cancelled_by_us,
    nothing_to_retry,
)
from airflow_batch_provider.batches.resubmit import Resubmission
from airflow_batch_provider.batches.submission import cancel_listed_siblings, cancel_siblings
from airflow_batch_provider.batches.token_budget import is_token_limit_refusal
from airflow_batch_provider.descriptors import ChunkDescriptor, CompletedBatch, SubmittedBatch, descriptor_argument
from airflow_batch_provider.exceptions import BatchCancelledError, BatchPollError, BatchProviderError, BatchTimeoutError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.links import BatchConsoleLink, remember_batch_url
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.progress import progress_base, progress_record, publish_progress
from airflow_batch_provider.sensors.errors import (
    cancelled_error,
    failed_error,
)
from airflow_batch_provider.sensors.record import Finished, Outcome, PollNext, WaitRecord, WaitUntil
from airflow_batch_provider.settings import default_deferrable
from airflow_batch_provider.status import BatchState, BatchStatus
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger

# Slightly over the providers' 24 h completion window: the provider expires the batch first.
DEFAULT_TIMEOUT = timedelta(hours=25)
CHECKPOINT_KEY = "batch_wait"


class BatchCompleteSensor(BaseSensorOperator):
    """Wait until a submitted batch ends, resend its retryable failed lines, and return every attempt's state.

    :param batch: a SubmitBatchOperator result (``{..., "batch_id": ...}``).
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param provider: override the provider named in the batch descriptor (empty: the batch's). Templated.
    :param poll_interval: seconds between status checks (also the poke interval when not deferred).
    :param max_poll_errors: failed polls in a row tolerated before the task fails.
    :param cancel_on_kill: cancel the provider batch when the task is killed or times out.
    :param deferrable: defer to the triggerer instead of poking in a worker slot (default: Airflow's
        ``[operators] default_deferrable``; set it True for the deployment, as a wait lasts hours).
    :param max_line_retries: follow-up batches allowed for retryable failed lines (0: none).
    :param token_limit_retry_interval: seconds to wait before resubmitting a batch the provider
        refused with ``token_limit_exceeded``.
    :param token_limit_max_wait: seconds of such refusals tolerated before BatchFailedError.

    ``timeout`` (default 25 h) applies to each attempt's batch.
    """

    # Not `batch`: an XCom descriptor, as SubmitBatchOperator.chunk (its rendered copy costs DB per chunk).
    template_fields: Sequence[str] = ("conn_id", "provider", "poll_interval")
    ui_color = "#fff4d6"
    operator_extra_links = (BatchConsoleLink(),)

    def __init__(
        self,
        *,
        batch: SubmittedBatch | dict[str, Any],
        conn_id: str | None = None,
        provider: str | None = None,
        poll_interval: float | str = 30.0,
        max_poll_errors: int = 5,
        cancel_on_kill: bool = True,
        deferrable: bool | None = None,
        max_line_retries: int = DEFAULT_MAX_LINE_RETRIES,
        token_limit_retry_interval: float = 300.0,
        token_limit_max_wait: float = 6 * 3600.0,
        map_index_template: str | None = "{{ task.batch['label'] }}",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("timeout", DEFAULT_TIMEOUT)
        if isinstance(poll_interval, int | float):
            kwargs.setdefault("poke_interval", poll_interval)
        # A signature default (not kwargs.setdefault) so that .partial() picks it up for mapped tasks.
        super().__init__(map_index_template=map_index_template, **kwargs)
        if isinstance(max_line_retries, bool) or not isinstance(max_line_retries, int) or max_line_retries < 0:
            raise ValueError(f"max_line_retries must be an integer >= 0, got {max_line_retries!r}")
        self.batch = descriptor_argument(batch, task_id=self.task_id, argument="batch", operator=type(self).__name__)
        self.conn_id = conn_id
        self.provider = provider
        self.poll_interval = poll_interval
        self.max_poll_errors = max_poll_errors
        self.cancel_on_kill = cancel_on_kill
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.max_line_retries = max_line_retries
        self.token_limit_retry_interval = float(token_limit_retry_interval)
        self.token_limit_max_wait = float(token_limit_max_wait)
        self._poll_errors = 0
        self._record: WaitRecord | None = None
        self._checkpoint: Checkpoint | None = None
        self._cancelled_now: set[str] = set()
        self._listed_siblings: list[str] | None = None  # the trigger's answer: the key's live batches at the end
        self._trigger_looks = False  # this run left its first sibling look-up to the trigger's shared list
        self._known_siblings: list[str] = []  # siblings the trigger named and this run asked to cancel

    @cached_property
    def hook(self) -> BatchHook:
        """The provider hook of this batch, built once per task run (tests may assign it)."""
        return get_batch_hook(self.provider or self.batch["provider"], self.conn_id)

    @property
    def _metrics(self) -> BatchMetrics:
        return BatchMetrics(provider=self.batch["provider"], model=self.batch.get("model", ""), dag_id=self.dag_id)

    @property
    def _label(self) -> str:
        return str(self.batch.get("label", ""))

    # -- the retry record (task state store, and carried through the trigger) -----------------------
    @property
    def record(self) -> WaitRecord:
        """The retry record, loaded by ``execute``, ``execute_complete`` and the first ``poke``."""
        if self._record is None:
            raise RuntimeError(f"{self._label}: the sensor's retry record was used before it was loaded")
        return self._record

    def _load(self, context: Context, carried: dict[str, Any] | None = None) -> WaitRecord:
        self._checkpoint = Checkpoint(context, CHECKPOINT_KEY)
        data = carried or self._checkpoint.load()
        origin = self.batch["batch_id"]
        if data and data.get("origin") == origin:
            self._record = WaitRecord.from_dict(data)
        else:  # the first run, or a record of an earlier submission (submit made a new batch)
            self._record = WaitRecord.start(origin)
            # The first look for an orphan's late create. Deferred with a backend whose list carries
            # keys, the trigger's first poll reads the shared list, which names them at no cost;
            # listed here, the look read back through every batch created since the chunk's intent:
            # in a 1,000-chunk job, the whole job's creates for the first chunks (docs/performance.md).
            self._trigger_looks = self.deferrable and self.hook.lists_keys and self.hook.list_page_size > 0
            if not self._trigger_looks:
                self._cancel_siblings()
        return self._record

    def _cancel_siblings(self, listed: list[str] | None = None) -> None:
        """Cancel other live batches with the submit's key (an orphan's late creates): at first sight and at the end.

        ``listed``: the live siblings the triggerer's shared list named when the batch ended (no list
        call then); None: list the provider's batches back to the chunk's first intent.
        """
        if key := self.batch.get("idempotency_key"):
            chunk, keep = cast(ChunkDescriptor, self.batch), self.batch["batch_id"]
            if listed is not None:
                cancelled = cancel_listed_siblings(self.hook, chunk, listed, keep, log=self.log)
            else:
                since = self.batch.get("key_since")
                cancelled = cancel_siblings(self.hook, chunk, key, keep, since=since, log=self.log)
            self._metrics.duplicates_cancelled(len(cancelled))

    @property
    def _follows_submitted(self) -> bool:
        """True while the batch waited for is the submitted one (its siblings carry the submit's key)."""
        return self.record.current.batch_id == self.batch["batch_id"]

    def _save(self) -> None:
        if self._checkpoint is not None and self._record is not None:
            self._checkpoint.save(self._record.to_dict())

    def _cancel_note(self, batch_id: str) -> str | None:
        return self.record.cancelled.get(batch_id) or cancelled_by_us(self.batch.get("job_dir"), batch_id)

    # -- entry points ---------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        """Follow the current attempt: return at once if all is done, else defer (or poke)."""
        if not self.batch["batch_id"]:  # an empty chunk (skip_unchanged): no batch was created
            return cast(CompletedBatch, {**self.batch, "state": None, "attempts": []})
        remember_batch_url(self, self.hook.batch_url(self.batch["batch_id"]))
        self._load(context)
        return self._drive(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Act on the trigger's event: finish, send a follow-up and defer again, or raise a typed error."""
        remember_batch_url(self, self.hook.batch_url(self.batch["batch_id"]))
        record = self._load(context, event.get("carry"))
        status = event.get("status")
        if status == "success":
            state = BatchState.from_dict(event["state"])
            listed = event.get("siblings")  # the trigger's list named the key's live batches (None: it did not)
            if isinstance(listed, list) and state.batch_id == record.current.batch_id == self.batch["batch_id"]:
                self._listed_siblings = [str(batch_id) for batch_id in listed]
            return self._drive(context, state if state.batch_id == record.current.batch_id else None)
        if status == "siblings":  # the trigger's list named live batches with the key (None: it could not look)
            listed = event.get("siblings")
            if record.current.batch_id == self.batch["batch_id"]:
                named = [str(batch_id) for batch_id in listed] if isinstance(listed, list) else None
                self._cancel_siblings(named)
                self._known_siblings = named or []  # the next trigger wakes us only for others
            seen = BatchState.from_dict(event["state"]) if event.get("state") else None
            return self._drive(context, seen if seen and seen.batch_id == record.current.batch_id else None)
        if status == "timeout":
            self._cancel("the sensor timed out")
            raise BatchTimeoutError(f"{self._label}: {event.get('message')}")
        raise BatchPollError(f"{self._label}: {event.get('message')}")

    def poke(self, context: Context) -> PokeReturnValue:
        """Check the current attempt once (non-deferrable mode)."""
        batch_id = (self._record or self._load(context)).current.batch_id
        try:
            state = self.hook.get_state(batch_id)
        except BatchProviderError as exc:
            self._poll_errors += 1
            if self._poll_errors >= self.max_poll_errors:
                raise BatchPollError(
                    f"{self._label}: polling batch {batch_id} failed "
                    f"{self._poll_errors} times in a row; last error: {exc}"
                ) from exc
            self.log.warning("poll failed (%d/%d): %s", self._poll_errors, self.max_poll_errors, exc)
            return PokeReturnValue(is_done=False)
        self._poll_errors = 0
        self.log.info("%s: %s", self._label, state.progress_line())
        self._publish(context, state)
        if state.status.is_terminal:
            match self._on_terminal(context, state):
                case Finished(result):
                    return PokeReturnValue(is_done=True, xcom_value=result)
        return PokeReturnValue(is_done=False)  # not ended, or a refusal wait / new batch: poke again

    # -- the loop ------------------------------------------------------------------------------------
    def _drive(self, context: Context, state: BatchState | None = None) -> Any:
        while True:
            if state is None:
                state = self.hook.get_state(self.record.current.batch_id)
                self.log.info("%s: %s", self._label, state.progress_line())
            self._publish(context, state)
            if not state.status.is_terminal:
                return self._wait(context)
            match self._on_terminal(context, state):
                case Finished(result):
                    return result
                case WaitUntil(until):
                    return self._wait(context, not_before=until)
                case PollNext():
                    state = None

    def _wait(self, context: Context, not_before: float | None = None) -> Any:
        self._save()
        if not self.deferrable:
            self.poke_interval = float(self.poll_interval)
            try:
                return super().execute(context)
            except (AirflowSensorTimeout, AirflowTaskTimeout) as exc:
                self._cancel("the sensor timed out")
                raise BatchTimeoutError(f"{self._label}: batch did not end in time ({exc})") from exc
        timeout = self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else float(self.timeout)
        self.defer(
            trigger=BatchCompleteTrigger(
                provider=self.provider or self.batch["provider"],
                conn_id=self.conn_id or self.hook.default_conn_name,
                batch_id=self.record.current.batch_id,
                poll_interval=float(self.poll_interval),
                timeout=timeout,
                max_poll_errors=self.max_poll_errors,
                cancel_on_kill=self.cancel_on_kill,
                label=self._label,
                not_before=not_before,
                job_dir=self.batch.get("job_dir"),
                carry=self.record.to_dict(),
                progress=progress_base(self.batch, len(self.record.attempts)),
                idempotency_key=self.batch.get("idempotency_key") if self._follows_submitted else None,
                first_look=self._trigger_looks and self._follows_submitted,
                known_siblings=self._known_siblings if self._follows_submitted else None,
            ),
            method_name="execute_complete",
            # A backstop only: the trigger fires its own timeout event first, so we can cancel.
            timeout=timedelta(seconds=timeout + 300 + max(0.0, (not_before or 0.0) - time.time())),
        )

    def _publish(self, context: Context, state: BatchState) -> None:
        """Publish this look at the batch for the "LLM batches" view (see :mod:`airflow_batch_provider.progress`)."""
        base = progress_base(self.batch, len(self.record.attempts))
        publish_progress(context, progress_record(base, state, self.hook.batch_url(state.batch_id)))

    def _on_terminal(self, context: Context, state: BatchState) -> Outcome:
        """Decide what an ended batch means: finished, a new batch to poll, wait, or raise."""
        attempt = len(self.record.attempts)
        if attempt == 1:  # an orphan's create can land after the first look (it may be in flight for minutes)
            listed, self._listed_siblings = self._listed_siblings, None
            self._cancel_siblings(listed if state.batch_id == self.batch["batch_id"] else None)
            if self.batch.get("adopted_unproven") and not self.record.current.replaced:
                chunk = cast(ChunkDescriptor, self.batch)
                if self.hook.owns(state, chunk) is not True:  # never use another chunk's results
                    self.log.warning("%s: batch %s, adopted provisionally, is not this chunk's (its results hold "
                                     "other rows); this chunk's lines go out as a new batch", self._label,
                                     state.batch_id)  # fmt: skip
                    return self._resubmission(context).replace(attempt)
        label = self._label if attempt == 1 else f"{self._label} attempt {attempt}"
        if state.status is BatchStatus.FAILED:
            if is_token_limit_refusal(state):
                return self._resubmission(context).token_limit_wait(
                    state, attempt, interval=self.token_limit_retry_interval, max_wait=self.token_limit_max_wait
                )
            raise failed_error(label, state)
        if state.status is BatchStatus.CANCELLED:
            if self._cancel_note(state.batch_id):
                return self._after_our_cancel(context, state, attempt)
            raise cancelled_error(label, state)
        # completed or expired: keep what finished, send the retryable failed lines again
        self.record.token_wait = None
        self.record.current.state = state
        self._save()
        if attempt > self.max_line_retries or nothing_to_retry(state):
            return self._resubmission(context).finish()
        return self._resubmission(context).follow_up(state, attempt, label)

    def _after_our_cancel(self, context: Context, state: BatchState, attempt: int) -> PollNext:
        why = self._cancel_note(state.batch_id)
        if state.batch_id in self._cancelled_now:  # this very run cancelled it: the task is ending
            raise BatchCancelledError(
                f"{self._label}: batch {state.batch_id} was cancelled by this task because {why}",
                batch_id=state.batch_id,
                state=state.to_dict(),
            )
        self.log.warning("%s: an earlier run cancelled batch %s (%s); this run sends its lines again",
                         self._label, state.batch_id, why)  # fmt: skip
        return self._resubmission(context).replace(attempt)

    def _resubmission(self, context: Context) -> Resubmission:
        return Resubmission(self.hook, self.batch, self.record, self._save, context, task_id=self.task_id,
                            dag_id=str(self.dag_id), checkpoint_key=CHECKPOINT_KEY,
                            max_line_retries=self.max_line_retries, metrics=self._metrics, log=self.log)  # fmt: skip

    # -- cancellation ---------------------------------------------------------------------------------
    def _cancel(self, why: str) -> None:
        if not self.cancel_on_kill:
            return
        batch_id = self._record.current.batch_id if self._record is not None else self.batch["batch_id"]
        self._cancelled_now.add(batch_id)
        if self._record is not None:  # recorded first: if the cancel call hangs, the record is there
            self._record.cancelled[batch_id] = why
            try:
                self._save()
            except Exception as exc:  # on_kill runs while the task is being torn down
                self.log.warning("could not checkpoint the cancel of batch %s: %s", batch_id, exc)
        if self.batch.get("job_dir"):
            try:
                mark_cancelled_by_us(self.batch["job_dir"], batch_id, why)
            except OSError as exc:
                self.log.warning("could not leave the cancel marker of batch %s: %s", batch_id, exc)
        try:
            self.hook.cancel(batch_id)
            self.log.warning("cancelled batch %s because %s", batch_id, why)
        except BatchProviderError as exc:
            self.log.warning("could not cancel batch %s: %s", batch_id, exc)

    def on_kill(self) -> None:
        """Cancel the batch when a poking task is killed (a deferred one is handled by its trigger)."""
        self._cancel("its task was killed")
