"""What a chunk's ended batch leads to: follow-up batches of failed lines, the same lines again, or the end.

BatchCompleteSensor decides *whether* an ended batch is finished, failed or worth sending again
(:meth:`~airflow_batch_provider.sensors.batch.BatchCompleteSensor._on_terminal`); this module
does the sending and the bookkeeping, the same whether the sensor pokes or was deferred:

- :meth:`Resubmission.follow_up`: the retryable failed lines of attempt *n* go out as attempt
  *n + 1* (see :mod:`~airflow_batch_provider.batches.line_retry`);
- :meth:`Resubmission.token_limit_wait`: a batch refused for the provider's enqueued-token cap is
  waited out, then :meth:`Resubmission.replace`\\ d by the same lines;
- :meth:`Resubmission.replace`: the current attempt's lines again as a new batch (after a refusal
  or this pipeline's own cancel);
- :meth:`Resubmission.finish`: every attempt's end state, as the sensor's result.

Every new batch is submitted through :func:`~airflow_batch_provider.batches.submission.submit_tagged`
under its own checkpoint key and recorded in the :class:`~airflow_batch_provider.sensors.record.WaitRecord`
(saved at once), so a retried task reattaches instead of sending the lines twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from airflow_batch_provider.batches.line_retry import attempt_chunk, followup_chunk, plan_followup
from airflow_batch_provider.batches.submission import submit_tagged
from airflow_batch_provider.batches.token_budget import RefusalStep, refusal_step
from airflow_batch_provider.descriptors import ChunkDescriptor, CompletedBatch, SubmittedBatch
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.progress import publish_attempt_errors
from airflow_batch_provider.sensors.errors import format_errors, refused_error, top_failures
from airflow_batch_provider.sensors.record import Attempt, Finished, PollNext, WaitRecord, WaitUntil
from airflow_batch_provider.status import BatchState


@dataclass
class Resubmission:
    """Send a chunk's lines again as new batches and keep its retry record (one per sensor run).

    ``save`` checkpoints ``record``; ``checkpoint_key`` prefixes each new batch's submission key.
    """

    hook: BatchHook
    batch: SubmittedBatch | dict[str, Any]
    record: WaitRecord
    save: Callable[[], None]
    context: Any
    task_id: str
    dag_id: str
    checkpoint_key: str
    max_line_retries: int
    metrics: BatchMetrics
    log: Any  # the task's logger (Airflow's structlog one in a task)

    @property
    def label(self) -> str:
        """The chunk's label, for log lines and errors."""
        return str(self.batch.get("label", ""))

    def submit(self, chunk: ChunkDescriptor, tag: str) -> SubmittedBatch:
        """Submit ``chunk`` as a new batch, checkpointed under ``tag`` (a retried task finds it)."""
        return submit_tagged(self.hook, chunk, self.context, task_id=self.task_id, dag_id=self.dag_id, tag=tag,
                             checkpoint_key=f"{self.checkpoint_key}.{tag}", log=self.log,
                             key_since=self.batch.get("key_since"))  # fmt: skip

    def follow_up(self, state: BatchState, attempt: int, label: str) -> Finished | PollNext:
        """Send attempt ``attempt``'s retryable failed lines as attempt ``attempt + 1`` (or finish: none)."""
        scan, written = plan_followup(self.hook, self.batch, state, attempt)
        publish_attempt_errors(self.context, state, attempt, scan)  # what failed, for the view, before the merge
        if scan.final_failures:
            self.log.info("%s: %d line(s) failed for good: %s",
                          label, scan.final_failed, top_failures(scan.final_failures))  # fmt: skip
        if written is None:
            return self.finish()
        submitted = self.submit(followup_chunk(self.batch, attempt + 1, written), f"attempt-{attempt + 1}")
        self.record.attempts.append(Attempt(submitted["batch_id"]))
        self.save()
        self.log.warning("%s: %d line(s) failed retryably (%s); sent them again as batch %s (attempt %d of at most %d)",
                         label, len(scan.retry_ids), top_failures(scan.retryable), submitted["batch_id"],
                         attempt + 1, self.max_line_retries + 1)  # fmt: skip
        return PollNext(submitted["batch_id"])

    def token_limit_wait(
        self, state: BatchState, attempt: int, *, interval: float, max_wait: float
    ) -> WaitUntil | PollNext:
        """Wait out a ``token_limit_exceeded`` refusal, then send the same lines again; raise past ``max_wait``."""
        wait = self.record.token_wait = self.record.token_wait or {}
        first_look = "resubmit_at" not in wait
        step = refusal_step(wait, now=time.time(), interval=interval, max_wait=max_wait)
        if step is RefusalStep.GIVE_UP:
            raise refused_error(self.label, state, waited=time.time() - wait["since"])
        if step is RefusalStep.WAIT:
            if first_look:
                self.save()
                left = wait["resubmit_at"] - time.time()
                self.log.warning("%s: batch %s refused (%s); the same lines go again in %.0f s",
                                 self.label, state.batch_id, format_errors(state.errors), left)  # fmt: skip
            return WaitUntil(wait["resubmit_at"])
        return self.replace(attempt)

    def replace(self, attempt: int) -> PollNext:
        """Send the current attempt's lines again as a new batch (after a refusal, or our own cancel)."""
        current = self.record.current
        current.replaced.append(current.batch_id)
        chunk = attempt_chunk(self.batch, attempt)
        submitted = self.submit(chunk, f"attempt-{attempt}.resubmit-{len(current.replaced)}")
        current.batch_id = submitted["batch_id"]
        self.save()
        self.log.info("%s: resubmitted the lines of batch %s as batch %s", self.label, current.replaced[-1],
                      submitted["batch_id"])  # fmt: skip
        return PollNext(submitted["batch_id"])

    def finish(self) -> Finished:
        """Return every attempt's end state (each batch ended, completed or expired, before the next was sent)."""
        states = [a.state.to_dict() for a in self.record.attempts if a.state is not None]
        last = BatchState.from_dict(states[-1])
        left = max(0, last.counts.total - last.counts.completed)
        self.log.info("%s: done after %d attempt(s) (batches %s); last attempt: %s%s",
                      self.label, len(states), ", ".join(s["batch_id"] for s in states), last.progress_line(),
                      f"; {left:,} line(s) of it did not succeed" if left else "")  # fmt: skip
        for state in states:
            self.metrics.batch_ended(state["status"])
        self.metrics.requests_in_flight(0, chunk_index=self.batch.get("chunk_index"))
        first = states[0]
        return Finished(
            cast(CompletedBatch, {**self.batch, "batch_id": first["batch_id"], "state": first, "attempts": states})
        )
