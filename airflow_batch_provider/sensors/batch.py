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

import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowTaskTimeout

from airflow_batch_provider.batches.checkpoint import Checkpoint
from airflow_batch_provider.batches.line_retry import (
    DEFAULT_MAX_LINE_RETRIES,
    attempt_chunk,
    cancelled_by_us,
    followup_chunk,
    mark_cancelled_by_us,
    nothing_to_retry,
    plan_followup,
)
from airflow_batch_provider.batches.token_budget import is_token_limit_refusal, refusal_step
from airflow_batch_provider.descriptors import ChunkDescriptor, CompletedBatch, SubmittedBatch
from airflow_batch_provider.exceptions import (
    BatchCancelledError,
    BatchEndedBadlyError,
    BatchExpiredError,
    BatchFailedError,
    BatchPollError,
    BatchProviderError,
    BatchTimeoutError,
)
from airflow_batch_provider.hooks.base import BatchHook, get_batch_hook
from airflow_batch_provider.links import BatchConsoleLink, remember_batch_url
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.operators.submit import submit_tagged
from airflow_batch_provider.status import BatchState, BatchStatus
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger

# Slightly over the providers' 24 h completion window: the provider expires the batch first.
DEFAULT_TIMEOUT = timedelta(hours=25)
CHECKPOINT_KEY = "batch_wait"


def default_deferrable() -> bool:
    """Deferrable unless ``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE`` explicitly turns it off.

    Airflow's own default for ``[operators] default_deferrable`` is False, which would make every
    sensor poke in a worker slot for hours. Airflow 3.3 also writes that default into the
    ``airflow.cfg`` it generates, so a value in the file cannot be told from the user's choice:
    only the environment variable (or ``deferrable=False`` on the task) switches deferral off.
    """
    explicit = os.environ.get("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE")
    if explicit is None:
        return True
    return explicit.strip().lower() in ("1", "true", "yes", "on", "t")


def _format_errors(errors: Sequence[dict[str, Any]], limit: int = 5) -> str:
    parts = []
    for err in list(errors)[:limit]:
        where = f" (line {err['line']})" if err.get("line") is not None else ""
        parts.append(f"{err.get('code')}{where}: {err.get('message')}")
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return "; ".join(parts) + more


def _top(counter: Counter[str], limit: int = 3) -> str:
    return ", ".join(f"{what} x{count:,}" for what, count in counter.most_common(limit))


def raise_for_state(batch: Mapping[str, Any], state: BatchState) -> None:
    """Raise the typed error for a batch that ended without usable results."""
    label = batch.get("label", f"batch {state.batch_id}")
    detail = _format_errors(state.errors)
    suffix = f": {detail}" if detail else ""
    args: dict[str, Any] = {"batch_id": state.batch_id, "errors": state.errors, "state": state.to_dict()}
    done = f"{state.counts.completed} of {state.counts.total} requests done"
    if state.status is BatchStatus.FAILED:
        raise BatchFailedError(f"{label}: batch {state.batch_id} failed at the provider{suffix}", **args)
    if state.status is BatchStatus.EXPIRED:
        raise BatchExpiredError(f"{label}: batch {state.batch_id} expired before finishing ({done}){suffix}", **args)
    if state.status is BatchStatus.CANCELLED:
        raise BatchCancelledError(
            f"{label}: batch {state.batch_id} was cancelled by someone else, not by this pipeline ({done}); "
            "nothing was resubmitted. Check the provider console; clearing this task sends the lines again.",
            **args,
        )
    raise BatchEndedBadlyError(f"{label}: batch {state.batch_id} ended {state.provider_status}", **args)


@dataclass(frozen=True)
class _Wait:
    """The current batch is terminal but must not be looked at again before ``until`` (epoch)."""

    until: float


_NEXT = "next"  # a new batch was created for the current or the next attempt: poll it


class BatchCompleteSensor(BaseSensorOperator):
    """Wait until a submitted batch ends, resend its retryable failed lines, and return every attempt's state.

    :param batch: a SubmitBatchOperator result (``{..., "batch_id": ...}``).
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param poll_interval: seconds between status checks (also the poke interval when not deferred).
    :param max_poll_errors: failed polls in a row tolerated before the task fails.
    :param cancel_on_kill: cancel the provider batch when the task is killed or times out.
    :param deferrable: defer to the triggerer (default: True unless the deployment turned
        ``[operators] default_deferrable`` off explicitly).
    :param max_line_retries: follow-up batches allowed for retryable failed lines (0: none).
    :param token_limit_retry_interval: seconds to wait before resubmitting a batch the provider
        refused with ``token_limit_exceeded``.
    :param token_limit_max_wait: seconds of such refusals tolerated before BatchFailedError.

    ``timeout`` (default 25 h) applies to each attempt's batch.
    """

    template_fields: Sequence[str] = ("batch", "conn_id", "poll_interval")
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
        self.batch = batch
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
        self._record: dict[str, Any] | None = None
        self._checkpoint: Checkpoint | None = None
        self._cancelled_now: set[str] = set()

    def _hook(self) -> BatchHook:
        return get_batch_hook(self.provider or self.batch["provider"], self.conn_id)

    @property
    def _metrics(self) -> BatchMetrics:
        return BatchMetrics(provider=self.batch["provider"], model=self.batch.get("model", ""), dag_id=self.dag_id)

    @property
    def _conn_id(self) -> str:
        return self.conn_id or self._hook().default_conn_name

    @property
    def _label(self) -> str:
        return str(self.batch.get("label", ""))

    # -- the retry record (task state store, and carried through the trigger) -----------------------
    def _load(self, context: Context, carried: dict[str, Any] | None = None) -> dict[str, Any]:
        self._checkpoint = Checkpoint(context, CHECKPOINT_KEY)
        record = carried or self._checkpoint.load()
        if not record or record.get("origin") != self.batch["batch_id"]:  # first run, or submit made a new batch
            record = {"origin": self.batch["batch_id"], "attempts": [{"batch_id": self.batch["batch_id"]}]}
        record.setdefault("cancelled", {})
        self._record = record
        return record

    def _save(self) -> None:
        if self._checkpoint is not None and self._record is not None:
            self._checkpoint.save(self._record)

    @property
    def _attempts(self) -> list[dict[str, Any]]:
        return (self._record or {"attempts": [{"batch_id": self.batch["batch_id"]}]})["attempts"]

    def _cancel_note(self, batch_id: str) -> str | None:
        noted = (self._record or {}).get("cancelled", {}).get(batch_id)
        return noted or cancelled_by_us(self.batch.get("job_dir"), batch_id)

    # -- entry points ---------------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        """Follow the current attempt: return at once if all is done, else defer (or poke)."""
        if not self.batch["batch_id"]:  # an empty chunk (skip_unchanged): no batch was created
            return cast(CompletedBatch, {**self.batch, "state": None, "attempts": []})
        remember_batch_url(self, self._hook().batch_url(self.batch["batch_id"]))
        self._load(context)
        return self._drive(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Act on the trigger's event: finish, send a follow-up and defer again, or raise a typed error."""
        remember_batch_url(self, self._hook().batch_url(self.batch["batch_id"]))
        self._load(context, event.get("carry"))
        status = event.get("status")
        if status == "success":
            state = BatchState.from_dict(event["state"])
            return self._drive(context, state if state.batch_id == self._attempts[-1]["batch_id"] else None)
        if status == "timeout":
            self._cancel("the sensor timed out")
            raise BatchTimeoutError(f"{self._label}: {event.get('message')}")
        raise BatchPollError(f"{self._label}: {event.get('message')}")

    def poke(self, context: Context) -> PokeReturnValue:
        """Check the current attempt once (non-deferrable mode)."""
        if self._record is None:
            self._load(context)
        try:
            state = self._hook().get_state(self._attempts[-1]["batch_id"])
        except BatchProviderError as exc:
            self._poll_errors += 1
            if self._poll_errors >= self.max_poll_errors:
                raise BatchPollError(
                    f"{self._label}: polling batch {self._attempts[-1]['batch_id']} failed "
                    f"{self._poll_errors} times in a row; last error: {exc}"
                ) from exc
            self.log.warning("poll failed (%d/%d): %s", self._poll_errors, self.max_poll_errors, exc)
            return PokeReturnValue(is_done=False)
        self._poll_errors = 0
        self.log.info("%s: %s", self._label, state.progress_line())
        if not state.status.is_terminal:
            return PokeReturnValue(is_done=False)
        outcome = self._on_terminal(context, state)
        if isinstance(outcome, dict):
            return PokeReturnValue(is_done=True, xcom_value=outcome)
        return PokeReturnValue(is_done=False)

    # -- the loop ------------------------------------------------------------------------------------
    def _drive(self, context: Context, state: BatchState | None = None) -> Any:
        hook = self._hook()
        while True:
            if state is None:
                state = hook.get_state(self._attempts[-1]["batch_id"])
                self.log.info("%s: %s", self._label, state.progress_line())
            if not state.status.is_terminal:
                return self._wait(context)
            outcome = self._on_terminal(context, state)
            if isinstance(outcome, _Wait):
                return self._wait(context, not_before=outcome.until)
            if outcome != _NEXT:
                return outcome
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
                conn_id=self._conn_id,
                batch_id=self._attempts[-1]["batch_id"],
                poll_interval=float(self.poll_interval),
                timeout=timeout,
                max_poll_errors=self.max_poll_errors,
                cancel_on_kill=self.cancel_on_kill,
                label=self._label,
                not_before=not_before,
                job_dir=self.batch.get("job_dir"),
                carry=self._record,
            ),
            method_name="execute_complete",
            # A backstop only: the trigger fires its own timeout event first, so we can cancel.
            timeout=timedelta(seconds=timeout + 300 + max(0.0, (not_before or 0.0) - time.time())),
        )

    def _on_terminal(self, context: Context, state: BatchState) -> CompletedBatch | _Wait | str:
        """Decide what an ended batch means: finished, a follow-up was sent, wait, or raise."""
        attempt = len(self._attempts)
        label = self._label if attempt == 1 else f"{self._label} attempt {attempt}"
        if state.status is BatchStatus.FAILED and is_token_limit_refusal(state):
            return self._token_limit_wait(context, state, attempt)
        if state.status is BatchStatus.CANCELLED and self._cancel_note(state.batch_id):
            return self._after_our_cancel(context, state, attempt)
        if state.status in (BatchStatus.FAILED, BatchStatus.CANCELLED):
            raise_for_state({**self.batch, "label": label}, state)
        self._record.pop("token_wait", None)  # type: ignore[union-attr]
        self._attempts[-1]["state"] = state.to_dict()
        self._save()
        if attempt > self.max_line_retries or nothing_to_retry(state):
            return self._finish()
        scan, written = plan_followup(self._hook(), self.batch, state, attempt)
        if scan.final_failures:
            self.log.info("%s: %d line(s) failed for good: %s", label, scan.final_failed, _top(scan.final_failures))
        if written is None:
            return self._finish()
        submitted = self._submit(context, followup_chunk(self.batch, attempt + 1, written), f"attempt-{attempt + 1}")
        self._attempts.append({"batch_id": submitted["batch_id"]})
        self._save()
        self.log.warning(
            "%s: %d line(s) failed retryably (%s); sent them again as batch %s (attempt %d of at most %d)",
            label,
            len(scan.retry_ids),
            _top(scan.retryable),
            submitted["batch_id"],
            attempt + 1,
            self.max_line_retries + 1,
        )
        return _NEXT

    def _token_limit_wait(self, context: Context, state: BatchState, attempt: int) -> _Wait | str:
        wait = (self._record or {}).setdefault("token_wait", {})
        first_look = "resubmit_at" not in wait
        step = refusal_step(
            wait, now=time.time(), interval=self.token_limit_retry_interval, max_wait=self.token_limit_max_wait
        )
        detail = _format_errors(state.errors)
        if step == "give_up":
            raise BatchFailedError(
                f"{self._label}: the provider refused batch {state.batch_id} for its enqueued-token limit for "
                f"{time.time() - wait['since']:,.0f} s ({detail}). Lower chunk_size, set token_budget on "
                "SubmitBatchOperator, or raise token_limit_max_wait.",
                batch_id=state.batch_id,
                errors=state.errors,
                state=state.to_dict(),
            )
        if step == "wait":
            if first_look:
                self._save()
                self.log.warning("%s: batch %s refused (%s); the same lines go again in %.0f s",
                                 self._label, state.batch_id, detail, wait["resubmit_at"] - time.time())  # fmt: skip
            return _Wait(wait["resubmit_at"])
        return self._replace(context, attempt)

    def _after_our_cancel(self, context: Context, state: BatchState, attempt: int) -> str:
        why = self._cancel_note(state.batch_id)
        if state.batch_id in self._cancelled_now:  # this very run cancelled it: the task is ending
            raise BatchCancelledError(
                f"{self._label}: batch {state.batch_id} was cancelled by this task because {why}",
                batch_id=state.batch_id,
                state=state.to_dict(),
            )
        self.log.warning("%s: an earlier run cancelled batch %s (%s); this run sends its lines again",
                         self._label, state.batch_id, why)  # fmt: skip
        return self._replace(context, attempt)

    def _replace(self, context: Context, attempt: int) -> str:
        """Send the current attempt's lines again as a new batch (after a refusal, or our own cancel)."""
        current = self._attempts[-1]
        replaced = current.setdefault("replaced", [])
        replaced.append(current["batch_id"])
        chunk = attempt_chunk(self.batch, attempt)
        submitted = self._submit(context, chunk, f"attempt-{attempt}.resubmit-{len(replaced)}")
        current["batch_id"] = submitted["batch_id"]
        self._save()
        self.log.info("%s: resubmitted the lines of batch %s as batch %s", self._label, replaced[-1],
                      submitted["batch_id"])  # fmt: skip
        return _NEXT

    def _submit(self, context: Context, chunk: ChunkDescriptor, tag: str) -> SubmittedBatch:
        return submit_tagged(
            self._hook(),
            chunk,
            context,
            task_id=self.task_id,
            dag_id=str(self.dag_id),
            tag=tag,
            checkpoint_key=f"{CHECKPOINT_KEY}.{tag}",
            log=self.log,
        )

    def _finish(self) -> CompletedBatch:
        states = [a["state"] for a in self._attempts]
        last = BatchState.from_dict(states[-1])
        left = max(0, last.counts.total - last.counts.completed)
        self.log.info(
            "%s: done after %d attempt(s) (batches %s); last attempt: %s%s",
            self._label,
            len(states),
            ", ".join(s["batch_id"] for s in states),
            last.progress_line(),
            f"; {left:,} line(s) of it did not succeed" if left else "",
        )
        for state in states:
            self._metrics.batch_ended(state["status"])
        self._metrics.requests_in_flight(0, chunk_index=self.batch.get("chunk_index"))
        first = states[0]
        return cast(CompletedBatch, {**self.batch, "batch_id": first["batch_id"], "state": first, "attempts": states})

    # -- cancellation ---------------------------------------------------------------------------------
    def _cancel(self, why: str) -> None:
        if not self.cancel_on_kill:
            return
        batch_id = self._attempts[-1]["batch_id"]
        self._cancelled_now.add(batch_id)
        if self._record is not None:  # recorded first: if the cancel call hangs, the record is there
            self._record.setdefault("cancelled", {})[batch_id] = why
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
            self._hook().cancel(batch_id)
            self.log.warning("cancelled batch %s because %s", batch_id, why)
        except BatchProviderError as exc:
            self.log.warning("could not cancel batch %s: %s", batch_id, exc)

    def on_kill(self) -> None:
        """Cancel the batch when a poking task is killed (a deferred one is handled by its trigger)."""
        self._cancel("its task was killed")
