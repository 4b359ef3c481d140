"""Operators of the streaming-intake DAG: collect a group, acknowledge it (the wait is sensors/intake.py).

``dags/stream_intake.py`` runs ``@continuous`` (one DAG run after another, ``max_active_runs=1``)::

    wait_for_group ─► collect_group ─► chunk ─► route ─┬─► server_generate (priority) ─┐
    (deferred:        (claims ≤ max_items;             └─► submit ─► wait ────────────┴─► merge ─► ack_group
     QueueGroupTrigger) bad ones → dead letter)                      (upsert by request id)  (only now)

The group's messages stay claimed (SQS visibility timeout / Redis pending entry) from
``collect_group`` until ``ack_group``, which runs only when the merge wrote every row: a
failure or crash anywhere in between lets the claim expire and a later run takes the group
again; the merge's sink upserts by request id, so nothing is written twice. On the batch route
:class:`GroupSubmitBatchOperator` keys the provider batch by the group (its message ids), not
by the run: the later run that takes the group again reattaches to the batch the failed run
paid for instead of creating a second one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowSkipException

from airflow_batch_provider import settings
from airflow_batch_provider.intake.aggregator import Aggregator, GroupPolicy
from airflow_batch_provider.intake.queues import open_queue
from airflow_batch_provider.intake.sizing import IntakeMetrics
from airflow_batch_provider.job_folder import sanitise_path_part
from airflow_batch_provider.operators.submit import SubmitBatchOperator


def policy_from(max_items: int | str, max_wait: float | str, claim_seconds: float | str) -> GroupPolicy:
    return GroupPolicy(max_items=int(max_items), max_wait=float(max_wait), claim_seconds=float(claim_seconds))


def queue_config_from(queue: dict[str, Any] | str) -> dict[str, Any]:
    config = orjson.loads(queue) if isinstance(queue, str) else dict(queue)
    if not isinstance(config, dict):
        raise ValueError(f"queue must be a JSON object with 'backend' and 'name', got {queue!r}")
    return config


class CollectGroupOperator(BaseOperator):
    """Claim one group and write it as a table (``request_id``, ``prompt``) for ChunkOperator.

    Returns ``{"group_id", "table", "receipts", "num_requests", "dead_lettered", ...}``; the
    receipts go to a file beside the table (``receipts``), not into XCom. Skips the rest of the
    run when nothing could be claimed (another consumer took it).
    """

    template_fields: Sequence[str] = ("queue_config", "max_items", "max_wait_seconds", "claim_seconds", "work_dir")
    ui_color = "#fff3e0"

    def __init__(
        self,
        *,
        queue_config: dict[str, Any] | str,
        max_items: int | str = 64,
        max_wait_seconds: float | str = 30.0,
        claim_seconds: float | str = 600.0,
        work_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.queue_config = queue_config
        self.max_items = max_items
        self.max_wait_seconds = max_wait_seconds
        self.claim_seconds = claim_seconds
        self.work_dir = work_dir

    def execute(self, context: Context) -> dict[str, Any]:
        """Collect, write the group table and its receipts, return where they are."""
        policy = policy_from(self.max_items, self.max_wait_seconds, self.claim_seconds)
        with open_queue(queue_config_from(self.queue_config)) as queue:
            metrics = IntakeMetrics(queue=queue.name, backend=queue.backend, dag_id=self.dag_id)
            group = Aggregator(queue, policy, metrics).collect()
        if group is None:
            raise AirflowSkipException("the queue had no claimable message left; the next run waits again")
        folder = os.path.join(self.work_dir or settings.work_dir(), "stream", sanitise_path_part(queue.name))
        folder = os.path.join(folder, group.group_id)
        os.makedirs(folder, exist_ok=True)
        table = pa.table(
            {"request_id": [r.request_id for r in group.requests], "prompt": [r.prompt for r in group.requests]}
        )
        table_path = os.path.join(folder, "requests.parquet")
        _write_atomic(table_path, lambda tmp: pq.write_table(table, tmp))
        receipts_path = os.path.join(folder, "receipts.json")
        _write_atomic(receipts_path, lambda tmp: _write_bytes(tmp, orjson.dumps(group.receipts)))
        return {
            "group_id": group.group_id,
            "table": table_path,
            "receipts": receipts_path,
            "folder": folder,
            "num_requests": len(group.requests),
            "dead_lettered": group.dead_lettered,
            "redelivered": group.redelivered,
            "fill_rate": len(group.requests) / policy.max_items,
            "flush_latency_s": round(group.flushed_at - group.first_enqueued_at, 3),
        }


class AckGroupOperator(BaseOperator):
    """Acknowledge a collected group's messages; put it after the step that writes the output."""

    template_fields: Sequence[str] = ("queue_config", "group")
    ui_color = "#fff3e0"

    def __init__(self, *, queue_config: dict[str, Any] | str, group: dict[str, Any] | Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.queue_config = queue_config
        self.group = group

    def execute(self, context: Context) -> int:
        """Delete / XACK every receipt of the group; return how many."""
        with open(self.group["receipts"], "rb") as handle:
            receipts = orjson.loads(handle.read())
        with open_queue(queue_config_from(self.queue_config)) as queue:
            queue.ack(receipts)
        self.log.info("group %s: acknowledged %d message(s)", self.group["group_id"], len(receipts))
        return len(receipts)


class GroupSubmitBatchOperator(SubmitBatchOperator):
    """SubmitBatchOperator whose idempotency key names the queue group instead of the DAG run.

    A run that fails after its batch was created leaves the group's messages claimed; when
    the claim lapses, a later run (a new run id) collects the same messages, so the same
    ``group_id`` (a hash of their message ids) and the same chunk fingerprint. Keyed by the
    run, :func:`submit_once` would find no batch for the new run's key and pay a second one;
    keyed by the group, it finds the first run's batch at the provider and reattaches. A
    group that comes back with other messages (new ones joined it) is another group, and
    another batch: only the exact same set of messages reuses a batch.

    :param group: CollectGroupOperator's return value (its ``group_id``), templated.
    """

    template_fields: Sequence[str] = (*SubmitBatchOperator.template_fields, "group")

    def __init__(self, *, group: dict[str, Any] | Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group = group

    def key_scope(self, run_id: str) -> str:
        """Return the group's id: the group stands where the run id stands in SubmitBatchOperator's key."""
        group_id = self.group.get("group_id") if isinstance(self.group, dict) else None
        if not isinstance(group_id, str) or not group_id.startswith("g-"):
            raise ValueError(
                f"{self.task_id}: 'group' must be collect_group's output with a group_id like 'g-…', got "
                f"{self.group!r}; pass group=<collect_group>.output"
            )
        return group_id

    def key_since(self, context: Context) -> float | None:
        """None: a group's key outlives the run (a later run reuses a failed run's batch), so no bound is known."""
        return None


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _write_atomic(path: str, write: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)
