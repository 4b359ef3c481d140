"""BatchCompleteTrigger: wait for a provider batch to end, on the triggerer, without a worker.

``run()`` only awaits (the async SDK client, ``asyncio.sleep``, and worker threads for what
would block: building the hook, writing the cancel marker), yields exactly one terminal event,
and is safe to run twice: a restarted triggerer simply polls again.

The trigger carries the sensor's small retry record (``carry``) and hands it back in every
event, so ``execute_complete`` knows which attempt it is looking at even without a task
state store. ``on_kill`` cancels the batch and leaves a marker in the job folder
(``retries/cancelled/<batch_id>.json``): the triggerer cannot write the task's checkpoint,
and a later run of the sensor must be able to tell "we cancelled it" from "someone else did".

Triggers of one provider connection in one triggerer poll through one
:class:`~airflow_batch_provider.triggers.poller.SharedPoller`: while several batches wait, one list
call answers them all, instead of one status call per batch per interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import cached_property
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batch_provider.batches.line_retry import mark_cancelled_by_us
from airflow_batch_provider.exceptions import BatchProviderError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.hooks.registry import get_batch_hook
from airflow_batch_provider.progress import apublish_progress, progress_record
from airflow_batch_provider.status import BatchState, BatchStatus
from airflow_batch_provider.triggers.poller import SharedPoller
from airflow_batch_provider.utils.retry import NO_RETRY


class BatchCompleteTrigger(BaseTrigger):
    """Poll one batch until it reaches a terminal status, then fire one event.

    Event payloads: ``{"status": "success", "state": {...}}`` when the batch reached any
    terminal status (the sensor decides what a failed/expired/cancelled batch means),
    ``{"status": "error", "message": ..., "state": last_state_or_None}`` when polling
    failed ``max_poll_errors`` times in a row, and ``{"status": "timeout", ...}`` when
    ``timeout`` seconds passed without a terminal status.

    Every event also carries ``carry`` (the kwarg, echoed unchanged). With ``idempotency_key``, a
    success event whose last poll the shared poller's list covered also carries ``siblings``: the
    other live batches with that key on the list (possibly none); without that answer it has none.

    :param cancel_on_kill: cancel the provider batch when Airflow kills the deferred task.
    :param not_before: wall-clock time (epoch seconds) before which the batch is not polled (the
        sensor waiting out a provider refusal); wall clock because it must survive a process change.
    :param job_dir: the chunk's job folder, where ``on_kill`` leaves its "cancelled by us" marker.
    :param carry: small JSON-able record returned as is in the event.
    :param progress: the chunk's fixed progress fields (:func:`~airflow_batch_provider.progress.progress_base`);
        when given, each poll that changes the counts is published for the "LLM batches" view.
    :param idempotency_key: the key the submit stored on the batch: whenever the shared list names
        live batches with it (an orphaned attempt's late create), the trigger fires a ``siblings``
        event so that the sensor cancels them, and the terminal event names those left at the end.
    :param first_look: the sensor left its first sibling look-up to this trigger: the first poll is
        answered by a list even while the batch waits alone, and when no list could answer it the
        trigger fires ``siblings`` with None (the sensor then lists on its own).
    :param known_siblings: siblings the sensor was handed already (it asked the provider to cancel
        them): while only these are live no ``siblings`` event fires, so a sibling whose cancel the
        provider is slow to act on does not wake the sensor every interval; the terminal event still
        names every live sibling, for the sensor's last cancel.
    """

    def __init__(
        self,
        *,
        provider: str,
        conn_id: str,
        batch_id: str,
        poll_interval: float = 30.0,
        timeout: float | None = None,
        max_poll_errors: int = 5,
        cancel_on_kill: bool = True,
        label: str = "",
        not_before: float | None = None,
        job_dir: str | None = None,
        carry: dict[str, Any] | None = None,
        progress: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        first_look: bool = False,
        known_siblings: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.provider = provider
        self.conn_id = conn_id
        self.batch_id = batch_id
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.max_poll_errors = max_poll_errors
        self.cancel_on_kill = cancel_on_kill
        self.label = label
        self.not_before = not_before
        self.job_dir = job_dir
        self.carry = carry
        self.progress = progress
        self.idempotency_key = idempotency_key
        self.first_look = first_look
        self.known_siblings = list(known_siblings or ())

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path and JSON-able kwargs that rebuild this trigger."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "provider": self.provider,
                "conn_id": self.conn_id,
                "batch_id": self.batch_id,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "max_poll_errors": self.max_poll_errors,
                "cancel_on_kill": self.cancel_on_kill,
                "label": self.label,
                "not_before": self.not_before,
                "job_dir": self.job_dir,
                "carry": self.carry,
                "progress": self.progress,
                "idempotency_key": self.idempotency_key,
                "first_look": self.first_look,
                "known_siblings": self.known_siblings,
            },
        )

    @cached_property
    def hook(self) -> BatchHook:
        """The hook that polls: one attempt per poll (tests may assign it).

        The SDK still retries quick blips; the trigger counts failed polls itself and tolerates
        ``max_poll_errors`` in a row.
        """
        return get_batch_hook(self.provider, self.conn_id, retry_policy=NO_RETRY)

    @cached_property
    def cancel_hook(self) -> BatchHook:
        """The hook that cancels on kill, with the full retry policy: a cancel must get through.

        Apart from :attr:`hook` because on_kill may run while the poll loop still uses its client.
        """
        return get_batch_hook(self.provider, self.conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until terminal; yield exactly one event.

        Nothing here may hold the triggerer's event loop, which runs every deferred task of the
        deployment: the hook is built in a worker thread (its first use imports the provider's SDK,
        a few hundred ms), and the hooks read their connection and build their async client off
        the loop too (:meth:`~airflow_batch_provider.hooks.base.BatchHook.aget_client`).
        Polls go through this loop's shared poller of the connection, which closes the SDK client
        when its last trigger leaves.
        """
        hook = await asyncio.to_thread(lambda: self.hook)
        if self.not_before is not None and self.not_before > time.time():
            await asyncio.sleep(self.not_before - time.time())
        poller = SharedPoller.join(self.provider, self.conn_id, self.batch_id, hook)
        try:
            async for event in self._poll(poller):
                yield event
        finally:
            await poller.leave(self.batch_id)
            if poller.hook is not hook:  # only the shared hook polled; this one opened nothing, normally
                await close_async_client(hook, self.log)

    async def _poll(self, poller: SharedPoller) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        errors_in_a_row = 0
        last_state: dict[str, Any] | None = None
        self._reported: tuple[str, BatchStatus | None, float] = ("", None, float("-inf"))  # line, status, when
        prefix = f"{self.label}: " if self.label else ""
        looked = not self.first_look
        while True:
            try:
                state = await poller.poll(self.batch_id, fresh_within=self.poll_interval / 2, list_alone=not looked)
            except BatchProviderError as exc:
                errors_in_a_row += 1
                self.log.warning(
                    "%spoll of batch %s failed (%d/%d in a row): %s",
                    prefix,
                    self.batch_id,
                    errors_in_a_row,
                    self.max_poll_errors,
                    exc,
                )
                if errors_in_a_row >= self.max_poll_errors:
                    message = f"polling batch {self.batch_id} failed {errors_in_a_row} times in a row; "
                    message += f"last error: {exc}"
                    yield self._event("error", last_state, message=message)
                    return
            else:
                errors_in_a_row = 0
                last_state = state.to_dict()
                await self._report(poller, state, prefix)
                if state.status.is_terminal:
                    yield self._success(poller, last_state)
                    return
                named = poller.siblings(self.idempotency_key, self.batch_id) if self.idempotency_key else []
                # Late creates not yet handed on, or a first look no list can make (none covered this batch).
                unknown = [batch_id for batch_id in named or () if batch_id not in self.known_siblings]
                if unknown or (named is None and not looked and not poller.answer_pending(self.batch_id)):
                    yield self._event("siblings", last_state, siblings=named)
                    return
                looked = looked or named is not None
            if self.timeout is not None and time.monotonic() - started >= self.timeout:
                message = f"batch {self.batch_id} did not end within {self.timeout:.0f} s"
                yield self._event("timeout", last_state, message=message)
                return
            await asyncio.sleep(poller.next_poll_in(self.batch_id, self.poll_interval))

    async def _report(self, poller: SharedPoller, state: BatchState, prefix: str) -> None:
        """Log and publish a look at the batch that changed: a new status at once, new counts no
        sooner than :meth:`~SharedPoller.progress_spacing` after the last report (each published
        record is a metadata-DB write by the triggerer)."""
        line, (last_line, last_status, last_at) = state.progress_line(), self._reported
        now = time.monotonic()
        if line == last_line or (state.status == last_status and now - last_at < poller.progress_spacing()):
            return
        self._reported = (line, state.status, now)
        self.log.info("%s%s", prefix, line)
        if self.progress is not None:
            record = progress_record(self.progress, state, poller.hook.batch_url(self.batch_id))
            await apublish_progress(self.task_instance, record)

    def _event(self, status: str, state: dict[str, Any] | None, **extra: Any) -> TriggerEvent:
        """An event the sensor's ``execute_complete`` reads: the last state seen and the carried record."""
        return TriggerEvent({"status": status, "batch_id": self.batch_id, "state": state, "carry": self.carry, **extra})

    def _success(self, poller: SharedPoller, state: dict[str, Any]) -> TriggerEvent:
        """The terminal event; ``siblings`` when the shared list covered the last poll (the sensor need not list)."""
        siblings = poller.siblings(self.idempotency_key, self.batch_id) if self.idempotency_key else None
        return self._event("success", state) if siblings is None else self._event("success", state, siblings=siblings)

    async def on_kill(self) -> None:
        """Cancel the provider batch when the deferred task is killed (Airflow 3.3+), and say it was us."""
        if not self.cancel_on_kill:
            return
        if self.job_dir:
            try:  # first the marker: if the cancel call hangs past on_kill's time limit, the record is there
                await asyncio.to_thread(mark_cancelled_by_us, self.job_dir, self.batch_id, "its task was killed")
            except OSError as exc:
                self.log.warning("could not record the cancel of batch %s in %s: %s", self.batch_id, self.job_dir, exc)
        hook = await asyncio.to_thread(lambda: self.cancel_hook)
        try:
            await hook.acancel(self.batch_id)
            self.log.info("cancelled batch %s because its task was killed", self.batch_id)
        except BatchProviderError as exc:
            self.log.warning("could not cancel batch %s on kill: %s", self.batch_id, exc)
        finally:
            await close_async_client(hook, self.log)


async def close_async_client(hook: BatchHook, log: Any) -> None:
    """Close ``hook``'s async SDK client (:meth:`BatchHook.aclose`); a failure to close is only logged."""
    try:
        await hook.aclose()
    except Exception as exc:  # closing must never turn a finished poll into a failure
        log.warning("could not close the %s client of batch polling: %s", hook.provider, exc)
