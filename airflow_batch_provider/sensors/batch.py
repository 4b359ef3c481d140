"""BatchCompleteSensor: wait for a chunk's provider batch to end, deferred by default.

While deferred no worker slot is held: the async trigger polls on the triggerer. A batch
that ends ``completed`` passes its state downstream; ``failed``, ``expired`` and
``cancelled`` raise typed errors carrying the provider's messages, which Airflow's
notifiers and ``on_failure_callback`` can route.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from airflow_batch_provider.descriptors import CompletedBatch, SubmittedBatch
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
from airflow_batch_provider.status import BatchState, BatchStatus
from airflow_batch_provider.triggers.batch import BatchCompleteTrigger

# Slightly over the providers' 24 h completion window: the provider expires the batch first.
DEFAULT_TIMEOUT = timedelta(hours=25)


def default_deferrable() -> bool:
    """Deferrable unless the deployment explicitly set ``[operators] default_deferrable``.

    Airflow's own default for that option is False, which would make every sensor poke; a batch
    can take hours, so we defer unless the user set the option (env var or airflow.cfg).
    """
    explicit = os.environ.get("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE")
    if explicit is None:
        explicit = _value_in_config_file("operators", "default_deferrable")
    if explicit is None:
        return True
    return explicit.strip().lower() in ("1", "true", "yes", "on", "t")


def _value_in_config_file(section: str, key: str) -> str | None:
    from airflow.configuration import conf

    try:  # private API; if it moves we treat the option as unset
        value = conf._get_option_from_config_file(None, None, key, section)
    except Exception:
        return None
    return value if isinstance(value, str) else None


def _format_errors(errors: Sequence[dict[str, Any]], limit: int = 5) -> str:
    parts = []
    for err in list(errors)[:limit]:
        where = f" (line {err['line']})" if err.get("line") is not None else ""
        parts.append(f"{err.get('code')}{where}: {err.get('message')}")
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return "; ".join(parts) + more


def raise_for_state(batch: Mapping[str, Any], state: BatchState) -> None:
    """Raise the typed error for a batch that ended without usable results."""
    label = batch.get("label", f"batch {state.batch_id}")
    detail = _format_errors(state.errors)
    suffix = f": {detail}" if detail else ""
    args: dict[str, Any] = {"batch_id": state.batch_id, "errors": state.errors, "state": state.to_dict()}
    if state.status is BatchStatus.FAILED:
        raise BatchFailedError(f"{label}: batch {state.batch_id} failed at the provider{suffix}", **args)
    if state.status is BatchStatus.EXPIRED:
        raise BatchExpiredError(
            f"{label}: batch {state.batch_id} expired before finishing "
            f"({state.counts.completed} of {state.counts.total} requests done){suffix}",
            **args,
        )
    if state.status is BatchStatus.CANCELLED:
        raise BatchCancelledError(
            f"{label}: batch {state.batch_id} was cancelled ({state.counts.completed} of {state.counts.total} "
            f"requests done). If nobody here cancelled it, check the provider console.",
            **args,
        )
    raise BatchEndedBadlyError(f"{label}: batch {state.batch_id} ended {state.provider_status}", **args)


class BatchCompleteSensor(BaseSensorOperator):
    """Wait until a submitted batch ends; return the chunk descriptor with the batch's final state.

    :param batch: a SubmitBatchOperator result (``{..., "batch_id": ...}``).
    :param conn_id: connection of the provider hook (default: the hook's default connection).
    :param poll_interval: seconds between status checks (also the poke interval when not deferred).
    :param max_poll_errors: failed polls in a row tolerated before the task fails.
    :param cancel_on_kill: cancel the provider batch when the task is killed or times out.
    :param deferrable: defer to the triggerer (default: True unless the deployment turned
        ``[operators] default_deferrable`` off explicitly).
    """

    template_fields: Sequence[str] = ("batch", "conn_id", "poll_interval")
    ui_color = "#fff4d6"

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
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("map_index_template", "{{ task.batch['label'] }}")
        kwargs.setdefault("timeout", DEFAULT_TIMEOUT)
        if isinstance(poll_interval, int | float):
            kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.batch = batch
        self.conn_id = conn_id
        self.provider = provider
        self.poll_interval = poll_interval
        self.max_poll_errors = max_poll_errors
        self.cancel_on_kill = cancel_on_kill
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self._poll_errors = 0

    def _hook(self) -> BatchHook:
        return get_batch_hook(self.provider or self.batch["provider"], self.conn_id)

    @property
    def _conn_id(self) -> str:
        return self.conn_id or self._hook().default_conn_name

    def _finish(self, state: BatchState) -> CompletedBatch:
        if state.status is not BatchStatus.COMPLETED:
            raise_for_state(self.batch, state)
        self.log.info("%s: %s", self.batch.get("label", ""), state.progress_line())
        return {**self.batch, "state": state.to_dict()}  # type: ignore[typeddict-item]

    def execute(self, context: Context) -> Any:
        """Return at once if the batch already ended; else defer (or poke)."""
        state = self._hook().get_state(self.batch["batch_id"])
        self.log.info("%s: %s", self.batch.get("label", ""), state.progress_line())
        if state.status.is_terminal:
            return self._finish(state)
        if not self.deferrable:
            self.poke_interval = float(self.poll_interval)
            return super().execute(context)
        timeout = self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else float(self.timeout)
        self.defer(
            trigger=BatchCompleteTrigger(
                provider=self.provider or self.batch["provider"],
                conn_id=self._conn_id,
                batch_id=self.batch["batch_id"],
                poll_interval=float(self.poll_interval),
                timeout=timeout,
                max_poll_errors=self.max_poll_errors,
                cancel_on_kill=self.cancel_on_kill,
                label=self.batch.get("label", ""),
            ),
            method_name="execute_complete",
            # A backstop only: the trigger fires its own timeout event first, so we can cancel.
            timeout=timedelta(seconds=timeout + 300),
        )

    def poke(self, context: Context) -> PokeReturnValue:
        """Check the batch once (non-deferrable mode)."""
        try:
            state = self._hook().get_state(self.batch["batch_id"])
        except BatchProviderError as exc:
            self._poll_errors += 1
            if self._poll_errors >= self.max_poll_errors:
                raise BatchPollError(
                    f"{self.batch.get('label', '')}: polling batch {self.batch['batch_id']} failed "
                    f"{self._poll_errors} times in a row; last error: {exc}"
                ) from exc
            self.log.warning("poll failed (%d/%d): %s", self._poll_errors, self.max_poll_errors, exc)
            return PokeReturnValue(is_done=False)
        self._poll_errors = 0
        self.log.info("%s: %s", self.batch.get("label", ""), state.progress_line())
        if not state.status.is_terminal:
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=self._finish(state))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> CompletedBatch:
        """Turn the trigger's event into the task's result or a typed error."""
        status = event.get("status")
        if status == "success":
            return self._finish(BatchState.from_dict(event["state"]))
        if status == "timeout":
            self._cancel("the sensor timed out")
            raise BatchTimeoutError(f"{self.batch.get('label', '')}: {event.get('message')}")
        raise BatchPollError(f"{self.batch.get('label', '')}: {event.get('message')}")

    def _cancel(self, why: str) -> None:
        if not self.cancel_on_kill:
            return
        try:
            self._hook().cancel(self.batch["batch_id"])
            self.log.warning("cancelled batch %s because %s", self.batch["batch_id"], why)
        except BatchProviderError as exc:
            self.log.warning("could not cancel batch %s: %s", self.batch["batch_id"], exc)

    def on_kill(self) -> None:
        """Cancel the batch when a poking task is killed (a deferred one is handled by its trigger)."""
        self._cancel("its task was killed")
