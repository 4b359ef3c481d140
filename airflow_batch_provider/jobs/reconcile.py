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
alone: nothing says which of its batches is the one a run used. It calls only the connections it
is configured for (each provider's default one, or those given with ``--conn-id``): a checkpoint
row naming another, or malformed, is skipped with a warning (:mod:`.checkpoints`).

Backends: those whose hook lists batches by key
(:meth:`~airflow_batch_provider.hooks.base.BatchHook.iter_keyed_batches`; OpenAI and Gemini) match
exactly. Anthropic's batches carry no key, so :func:`reconcile_unkeyed` matches what the checkpoints
say instead: a live batch that no checkpoint names, of the request count of a chunk whose create once
had an unknown outcome (``unsure_since``, recorded by the retry that found only an intent), created
after that create, is that create landing late: cancelled. It is not done while a create of that size
is still in flight somewhere (its batch would look the same), and a workspace shared with other
Anthropic batch users could, in principle, hold a stranger of the same size and time: that is the
price of a key-less API (docs/durability.md). Ended duplicates are proven by their rows and reported.
The DAG ``batch_maintenance`` runs it hourly.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk.exceptions import AirflowNotFoundException, AirflowOptionalProviderFeatureException

from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.hooks.base import BatchHook
from airflow_batch_provider.jobs.checkpoints import (
    Submission,
    checkpoint_rows,
    claimed_batches,
    configured,
    submissions,
)
from airflow_batch_provider.metrics import BatchMetrics
from airflow_batch_provider.status import BatchState, BatchStatus

log = logging.getLogger(__name__)

#: Allowed clock difference between the worker that recorded a time and the provider that stamps a batch.
CLOCK_SKEW_S = 120.0
#: An intent with no batch yet younger than this may be a create still on its way: its size is left alone.
IN_FLIGHT_S = 3600.0
UNSURE = "no checkpoint names it; it has the size of a create whose outcome was unknown, made after it, whose chunk is"
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
    usd_per_request: float | None = None
    why: str = ""  # how it was told from the served batch, when not by its key

    @property
    def cost_usd(self) -> float | None:
        """What the requests that had run cost, at the chunk's expected price (None: unpriced)."""
        return None if self.usd_per_request is None else self.requests_run * self.usd_per_request

    def line(self) -> str:
        """The ALERT line for the log."""
        action = "cancelled" if self.cancelled else f"already {self.status}, could not be cancelled"
        whose = f"its key {self.key[:12]}… is" if self.key else (self.why or "its rows are")
        price = "" if self.cost_usd is None else f", ≈ ${self.cost_usd:,.4f} at the chunk's expected price"
        return (
            f"ALERT late duplicate {self.provider} batch {self.batch_id}: {whose} served by "
            f"batch {self.served_by}; {action}; cost: {self.requests_run:,} of {self.requests_total:,} "
            f"request(s) had run (billed{price})"
        )


def reconcile(
    hook: BatchHook,
    records: Iterable[Submission],
    *,
    since: float,
    dry_run: bool = False,
    metrics: BatchMetrics | None = None,
) -> list[Duplicate]:
    """Cancel the live batches created after ``since`` whose key a record maps to another batch; return all found."""
    served = {record.key: record for record in records if record.batch_id}
    found: list[Duplicate] = []
    for key, state in hook.iter_keyed_batches(since):
        keep = served.get(key)
        if keep is None or keep.batch_id == state.batch_id or state.status in _DEAD:
            continue
        found.append(_settle(hook, state, key, keep, dry_run))
    _count(hook, found, metrics)
    return found


def reconcile_unkeyed(
    hook: BatchHook,
    records: Iterable[Submission],
    *,
    since: float,
    dry_run: bool = False,
    metrics: BatchMetrics | None = None,
    claimed: Iterable[str] = (),
) -> list[Duplicate]:
    """Find the late duplicates among batches that carry no key (Anthropic); cancel the live ones; return all.

    A live batch is one when no record names it and it matches an unsure create (see the module
    docstring). An ended batch is one when its first result's custom id is among the rows of a
    served batch of its size (custom ids are row ids): reported, as it cannot be cancelled.
    ``claimed``: more batch ids that are never strays (those of checkpoint rows skipped as bad).
    """
    records = list(records)
    claimed = {*claimed, *(record.batch_id for record in records if record.batch_id)}
    mine = [record for record in records if record.provider in (None, hook.provider)]
    recent = time.time() - IN_FLIGHT_S
    in_flight = {r.num_requests for r in mine if not r.batch_id and (r.intent_at or 0) > recent}
    listed = list(hook.iter_unkeyed_batches(since))
    strays = [state for state in listed if state.batch_id not in claimed]
    found = []
    for state in strays:
        if state.status.is_terminal or state.counts.total in in_flight:
            continue
        if (owner := _unsure_owner(state, mine)) is not None:
            found.append(_settle(hook, state, UNSURE, owner, dry_run))
    ended = [s for s in strays if s.status.is_terminal and s.status is not BatchStatus.CANCELLED]
    found += _ended_by_rows(hook, ended, [s for s in listed if s.batch_id in claimed])
    _count(hook, found, metrics)
    return found


def _unsure_owner(state: BatchState, records: list[Submission]) -> Submission | None:
    """Return the record whose unsure create ``state`` may be: same size, created after it (None: none).

    The latest such create is named (the nearest in time is the likeliest sender).
    """
    for record in sorted(records, key=lambda r: -(r.unsure_since or 0.0)):
        if record.unsure_since is None or record.num_requests != state.counts.total or not record.batch_id:
            continue
        if state.created_at is not None and state.created_at >= record.unsure_since - CLOCK_SKEW_S:
            return record
    return None


def _ended_by_rows(hook: BatchHook, ended: list[BatchState], owners: list[BatchState]) -> list[Duplicate]:
    """Return the ``ended`` unclaimed batches whose first row belongs to one of ``owners`` of the same size."""
    rows: dict[str, set[str]] = {}  # served batch -> its custom ids, read once
    found: list[Duplicate] = []
    for state in ended:
        first = next((r["custom_id"] for r in hook.iter_results(state)), None)
        for owner in (o for o in owners if o.status.is_terminal and o.counts.total == state.counts.total):
            if owner.batch_id not in rows:
                rows[owner.batch_id] = {r["custom_id"] for r in hook.iter_results(owner)}
            if first is not None and first in rows[owner.batch_id]:
                found.append(_settle(hook, state, "", Submission("", owner.batch_id), dry_run=True))
                break
    return found


def _settle(hook: BatchHook, state: BatchState, key: str, keep: Submission, dry_run: bool) -> Duplicate:
    """Cancel ``state`` if it still runs (unless ``dry_run``); log and return its ALERT record.

    ``key``: the idempotency key it carries, or (a key-less backend) :data:`UNSURE` or "" (its rows).
    """
    why, key = (key, "") if key == UNSURE else ("", key)
    cancel = not state.status.is_terminal and not dry_run
    if cancel:
        state = hook.cancel(state.batch_id)
    duplicate = Duplicate(hook.provider, state.batch_id, key, str(keep.batch_id), state.provider_status,
                          state.counts.completed + state.counts.failed, state.counts.total, cancel,
                          keep.usd_per_request, why)  # fmt: skip
    log.warning("%s", duplicate.line())
    return duplicate


def _count(hook: BatchHook, found: list[Duplicate], metrics: BatchMetrics | None) -> None:
    metrics = metrics or BatchMetrics(provider=hook.provider, model="any", dag_id="batch_maintenance")
    metrics.late_duplicates(len(found), sum(d.cancelled for d in found))


def run(
    providers: Sequence[str] | None,
    *,
    since_seconds: float,
    conn_ids: Mapping[str, Sequence[str]] | None = None,
    database: str | None = None,
    dry_run: bool = False,
) -> list[Duplicate]:
    """Reconcile each configured ``(provider, connection)`` against the checkpoints; return the duplicates found.

    A provider's connections are those ``conn_ids`` lists for it, else its default one.
    ``providers`` None: each batch backend the checkpoints name, so one hourly run covers whatever
    this deployment submitted to. A checkpoint row that is malformed, or names another provider or
    connection, is skipped with a warning (:mod:`.checkpoints`): a stored row never chooses what
    this job calls.
    """
    from airflow_batch_provider.backends.registry import backend_names
    from airflow_batch_provider.hooks.registry import get_batch_hook

    conn_ids = conn_ids or {}
    default_conn = _default_connections(strict=providers is not None)
    rows = checkpoint_rows(database)
    records = submissions(rows, backend_names())
    if providers is not None:
        records = [record for record in records if record.provider_name in providers]
    records = configured(records, default_conn, conn_ids)

    def target(record: Submission) -> tuple[str, str]:
        return record.provider_name, str(record.conn_id or default_conn(record.provider_name))

    if providers is None:
        targets = {target(record) for record in records}
    else:
        targets = {(name, conn) for name in providers for conn in conn_ids.get(name) or [str(default_conn(name))]}
    claimed, since = claimed_batches(rows), time.time() - since_seconds
    found: list[Duplicate] = []
    for provider, conn_id in sorted(targets):
        mine = [record for record in records if target(record) == (provider, conn_id)]
        hook = get_batch_hook(provider, conn_id)
        found += _reconcile_one(hook, mine, since, dry_run, claimed, asked=providers is not None)
    return found


def _default_connections(*, strict: bool) -> Callable[[str], str | None]:
    """Return ``provider -> its hook's default connection`` (None: its SDK is not installed, unless ``strict``)."""
    from airflow_batch_provider.hooks.registry import hook_class_for

    @functools.cache
    def default_conn(provider: str) -> str | None:
        try:
            return str(hook_class_for(provider).default_conn_name)
        except AirflowOptionalProviderFeatureException:
            if strict:  # asked for by name: the caller's to fix
                raise
            return None  # its rows are skipped and reported

    return default_conn


def _reconcile_one(
    hook: Any, records: list[Submission], since: float, dry_run: bool, claimed: set[str], *, asked: bool
) -> list[Duplicate]:
    """Reconcile one connection; a missing one only old checkpoints name is reported and skipped (unless ``asked``)."""
    try:
        if hook.exact_reconcile:
            return reconcile(hook, records, since=since, dry_run=dry_run)
        return reconcile_unkeyed(hook, records, since=since, dry_run=dry_run, claimed=claimed)
    except (AirflowNotFoundException, ProviderCallError) as error:
        missing = isinstance(error, AirflowNotFoundException) or isinstance(error.__cause__, AirflowNotFoundException)
        if asked or not missing:  # asked for by name: a missing connection is the caller's error
            raise
        # Named only by old checkpoints (a connection since removed): say so, and check the others.
        log.warning("connection %r of provider %s does not exist: its batches were not checked", hook.conn_id,
                    hook.provider)  # fmt: skip
        return []
