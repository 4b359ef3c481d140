"""``python -m airflow_batch_provider.jobs reconcile --since 24h``: cancel duplicate batches that landed late.

A create whose answer was lost, or that reached the provider after its client gave up (a slow
proxy, a killed worker), can make a batch after every check a task runs (submit's reconcile, the
sensor's first and last look). This job keeps looking after the runs: it lists the provider's
batches created within ``--since`` that carry this package's idempotency key, reads which batch
each key's checkpoint names (Airflow's task state store: SubmitBatchOperator's
``batch_submission`` and the sensor's follow-ups ``batch_wait.*``), and cancels every other live
batch with that key. Each duplicate is an ``ALERT`` log line saying what it cost (requests that
had run are billed), and counts in ``llm_batch.late_duplicate_batches`` (alert on any) and
``llm_batch.duplicate_batches_cancelled``. A duplicate that already ended cannot be cancelled:
it is reported all the same. A key with no checkpoint (the run's store was cleared) is left
alone: nothing says which of its batches is the one a run used.

Backends: those whose hook lists batches by key
(:meth:`~airflow_batch_provider.hooks.base.BatchHook.iter_keyed_batches`; OpenAI and Gemini); for
Anthropic, whose batches carry no key, :func:`reconcile_unkeyed` reports ended duplicates by their rows. The DAG
``batch_maintenance`` runs it hourly. See docs/durability.md.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.status import BatchStatus

log = logging.getLogger(__name__)

#: Checkpoint keys whose records name a key's batch: the submit's, and the sensor's follow-ups.
SUBMIT_CHECKPOINT = "batch_submission"
FOLLOW_UP_PREFIX = "batch_wait."
_DEAD = frozenset({BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.CANCELLING})


@dataclass(frozen=True)
class Duplicate:
    """A batch whose idempotency key is already served by the batch its checkpoint names."""

    provider: str
    batch_id: str
    key: str
    served_by: str
    status: str
    requests_run: int
    requests_total: int
    cancelled: bool

    def line(self) -> str:
        """The ALERT line for the log."""
        action = "cancelled" if self.cancelled else f"already {self.status}, could not be cancelled"
        whose = f"its key {self.key[:12]}… is" if self.key else "its rows are"
        return (
            f"ALERT late duplicate {self.provider} batch {self.batch_id}: {whose} served by "
            f"batch {self.served_by}; {action}; cost: {self.requests_run:,} of {self.requests_total:,} "
            "request(s) had run (billed)"
        )


def served_keys(rows: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """Return ``idempotency key -> batch id`` from checkpoint rows ``(store key, JSON value)``.

    Rows are hostile input like any stored value: anything that is not a record with a string
    key and a string batch id is skipped.
    """
    served: dict[str, str] = {}
    for name, value in rows:
        if name != SUBMIT_CHECKPOINT and not name.startswith(FOLLOW_UP_PREFIX):
            continue
        try:
            record = json.loads(value or "")
        except (TypeError, ValueError):
            continue
        if isinstance(record, dict):
            key, batch_id = record.get("idempotency_key"), record.get("batch_id")
            if isinstance(key, str) and isinstance(batch_id, str) and key and batch_id:
                served[key] = batch_id
    return served


def checkpoint_rows(database: str | None = None) -> list[tuple[str, str | None]]:
    """Read the checkpoint rows from Airflow's metadata DB (or the SQLAlchemy URL ``database``)."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import create_engine, or_, select
    from sqlalchemy.orm import Session

    query = select(TaskStateStoreModel.key, TaskStateStoreModel.value).where(
        or_(TaskStateStoreModel.key == SUBMIT_CHECKPOINT, TaskStateStoreModel.key.like(f"{FOLLOW_UP_PREFIX}%"))
    )
    if database:
        with Session(create_engine(database)) as session:
            return [(str(k), v) for k, v in session.execute(query)]
    from airflow.utils.session import create_session

    with create_session() as session:
        return [(str(k), v) for k, v in session.execute(query)]


def reconcile(
    hook: BatchHook,
    served: Mapping[str, str],
    *,
    since: float,
    dry_run: bool = False,
    metrics: BatchMetrics | None = None,
) -> list[Duplicate]:
    """Cancel the live batches created after ``since`` whose key ``served`` maps to another batch; return all found."""
    found: list[Duplicate] = []
    for key, state in hook.iter_keyed_batches(since):
        keep = served.get(key)
        if keep is None or keep == state.batch_id or state.status in _DEAD:
            continue
        cancel = not state.status.is_terminal and not dry_run
        if cancel:
            state = hook.cancel(state.batch_id)
        duplicate = Duplicate(hook.provider, state.batch_id, key, keep, state.provider_status,
                              state.counts.completed + state.counts.failed, state.counts.total, cancel)  # fmt: skip
        log.warning("%s", duplicate.line())
        found.append(duplicate)
    metrics = metrics or BatchMetrics(provider=hook.provider, model="any", dag_id="batch_maintenance")
    metrics.late_duplicates(len(found), sum(d.cancelled for d in found))
    return found


def reconcile_unkeyed(
    hook: BatchHook, served: set[str], *, since: float, metrics: BatchMetrics | None = None
) -> list[Duplicate]:
    """Report the ended batches since ``since`` that hold rows of a checkpointed (``served``) batch; return them.

    For a backend with no key on its batches (Anthropic): a batch is a duplicate of a served one
    when its first result's custom id is among the served batch's (custom ids are row ids). Only
    ended batches can be read, and an ended batch cannot be cancelled: these are reported (ALERT,
    metric), never cancelled. A batch still running is looked at by a later run.
    """
    batches = list(hook.iter_unkeyed_batches(since))
    ended = [s for s in batches if s.status.is_terminal and s.status is not BatchStatus.CANCELLED]
    rows: dict[str, set[str]] = {}  # served batch -> its custom ids, read once
    found: list[Duplicate] = []
    for state in ended:
        if state.batch_id in served:
            continue
        first = next((r["custom_id"] for r in hook.iter_results(state)), None)
        for owner in (s for s in ended if s.batch_id in served and s.counts.total == state.counts.total):
            if owner.batch_id not in rows:
                rows[owner.batch_id] = {r["custom_id"] for r in hook.iter_results(owner)}
            if first is not None and first in rows[owner.batch_id]:
                duplicate = Duplicate(hook.provider, state.batch_id, "", owner.batch_id,
                                      state.provider_status, state.counts.completed + state.counts.failed,
                                      state.counts.total, False)  # fmt: skip
                log.warning("%s", duplicate.line())
                found.append(duplicate)
                break
    metrics = metrics or BatchMetrics(provider=hook.provider, model="any", dag_id="batch_maintenance")
    metrics.late_duplicates(len(found), 0)
    return found


def run(
    providers: Iterable[str],
    *,
    since_seconds: float,
    conn_ids: Mapping[str, str] | None = None,
    database: str | None = None,
    dry_run: bool = False,
) -> list[Duplicate]:
    """Reconcile every provider in ``providers`` against the checkpoints; return the duplicates found."""
    from airflow_batch_provider.hooks.registry import get_batch_hook

    served = served_keys(checkpoint_rows(database))
    since = time.time() - since_seconds
    found: list[Duplicate] = []
    for provider in providers:
        hook: Any = get_batch_hook(provider, (conn_ids or {}).get(provider))
        if hook.exact_reconcile:
            found += reconcile(hook, served, since=since, dry_run=dry_run)
        else:
            found += reconcile_unkeyed(hook, set(served.values()), since=since)
    return found
