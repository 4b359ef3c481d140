"""The submission checkpoints ``jobs reconcile`` reads, and which of them it may act on.

Each row of Airflow's task state store under ``batch_submission`` (SubmitBatchOperator) or
``batch_wait.*`` (the sensor's follow-ups) names the batch that serves a chunk's idempotency key,
and the provider and connection it was created through. A row is stored input like any other: a
value that is not such a record, or a field of the wrong type or out of range
(``num_requests: 1e999``, a provider that is no batch backend), makes the row *bad*; one that
names a connection this job is not configured for makes it *foreign*. Either is skipped with one
warning naming the DAG, run and chunk and what is wrong; the others are still reconciled. A
skipped row's batch still counts as claimed (:func:`claimed_batches`): nothing a checkpoint
names is ever taken for a stray.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

#: Checkpoint keys whose records name a key's batch: the submit's, and the sensor's follow-ups.
SUBMIT_CHECKPOINT = "batch_submission"
FOLLOW_UP_PREFIX = "batch_wait."
#: A record from before intents named their provider is OpenAI's (the only backend then).
LEGACY_PROVIDER = "openai"
#: Larger than any batch a provider takes; a count past it is not a count.
MAX_COUNT = 10**9


class CheckpointRow(NamedTuple):
    """One stored checkpoint: its store key, its JSON value, and where it is from (for warnings)."""

    name: str
    value: str | None
    where: str = "a checkpoint row"


@dataclass(frozen=True)
class Submission:
    """One checkpoint record: the batch that serves a chunk's key, and what matching a stray batch needs."""

    key: str
    batch_id: str | None
    provider: str | None = None
    num_requests: int | None = None
    unsure_since: float | None = None  # an earlier create's outcome was unknown from this time on
    intent_at: float | None = None
    conn_id: str | None = None  # the connection the batch was created through
    usd_per_request: float | None = None  # the chunk's expected price per request
    where: str = field(default="", compare=False)  # the row it was read from, for warnings

    @classmethod
    def parse(cls, value: str | None) -> Submission:
        """Read one stored record; raise ``ValueError`` saying what is wrong with a malformed one."""
        try:
            record = json.loads(value or "")
        except (TypeError, ValueError, RecursionError):
            raise ValueError("its value is not JSON") from None
        if not isinstance(record, dict):
            raise ValueError(f"its value is a JSON {type(record).__name__}, not an object")
        key = record.get("idempotency_key")
        if not isinstance(key, str) or not key:
            raise ValueError("it has no idempotency_key")
        return cls(
            key=key,
            batch_id=_text(record, "batch_id"),
            provider=_text(record, "provider"),
            num_requests=_number(record, "num_requests", int),
            unsure_since=_number(record, "unsure_since", float),
            intent_at=_number(record, "intent_at", float),
            conn_id=_text(record, "conn_id"),
            usd_per_request=_number(record, "usd_per_request", float),
        )

    @property
    def provider_name(self) -> str:
        """The provider the batch was created with (a record from before they were named: OpenAI)."""
        return self.provider or LEGACY_PROVIDER


def _text(record: Mapping[str, Any], name: str) -> str | None:
    value = record.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError(f"{name} {_shown(value)} is not a name of 1-256 characters")
    return value


def _number(record: Mapping[str, Any], name: str, kind: type) -> Any:
    value = record.get(name)
    if value is None:
        return None
    finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not finite or value < 0 or (kind is int and (value != int(value) or value > MAX_COUNT)):
        what = f"a whole number up to {MAX_COUNT:,}" if kind is int else "a finite number ≥ 0"
        raise ValueError(f"{name} {_shown(value)} is not {what}")
    return kind(value)


def _shown(value: Any) -> str:
    text = repr(value)  # escaped: a stored value may hold anything
    return text if len(text) <= 40 else f"{text[:37]}…"


def _is_submission(name: str) -> bool:
    return name == SUBMIT_CHECKPOINT or name.startswith(FOLLOW_UP_PREFIX)


def submissions(
    rows: Iterable[tuple[str, str | None] | CheckpointRow], providers: Iterable[str] | None = None
) -> list[Submission]:
    """Return the submission records among checkpoint rows; warn about and skip each bad one.

    ``providers``: the batch backends a record may name (None: any).
    """
    known = None if providers is None else set(providers)
    found: list[Submission] = []
    for row in rows:
        name, value, where = CheckpointRow(*row)
        if not _is_submission(name):
            continue
        try:
            record = Submission.parse(value)
            if known is not None and record.provider_name not in known:
                raise ValueError(f"provider {_shown(record.provider)} is not a batch backend ({sorted(known)})")
        except ValueError as error:
            log.warning("skipped %s (%r): %s; nothing of it is reconciled", where, name, error)
            continue
        found.append(replace(record, where=where))
    return found


def served_keys(rows: Iterable[tuple[str, str | None] | CheckpointRow]) -> dict[str, str]:
    """Return ``idempotency key -> batch id`` from checkpoint rows (records with no batch yet are left out)."""
    return {record.key: record.batch_id for record in submissions(rows) if record.batch_id}


def claimed_batches(rows: Iterable[tuple[str, str | None] | CheckpointRow]) -> set[str]:
    """Return every batch id any checkpoint row names, bad or foreign rows included: none is a stray."""
    claimed = set()
    for row in rows:
        name, value, _ = CheckpointRow(*row)
        if not _is_submission(name) or not isinstance(value, str):
            continue
        try:
            record = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict) and isinstance(record.get("batch_id"), str):
            claimed.add(record["batch_id"])
    return claimed


def configured(
    records: Iterable[Submission], default_conn: Callable[[str], str | None], conn_ids: Mapping[str, Iterable[str]]
) -> list[Submission]:
    """Return the records that name a connection this job is configured for; warn about and skip the others.

    A provider's connections are those ``conn_ids`` lists for it, else its default
    (``default_conn(provider)``; None: its hook cannot be loaded here); a record naming no
    connection was made through the default.
    """
    kept = []
    for record in records:
        provider, default = record.provider_name, default_conn(record.provider_name)
        allowed = list(conn_ids.get(provider) or ([default] if default else []))
        conn_id = record.conn_id or default
        if conn_id is not None and conn_id in allowed:
            kept.append(record)
        elif default is None:
            log.warning("skipped %s: provider %s cannot be loaded here (is its SDK installed?); nothing of it is "
                        "reconciled", record.where or "a checkpoint", provider)  # fmt: skip
        else:
            log.warning(
                "skipped %s: connection %r is not one this job checks for %s (%s); nothing of it is reconciled "
                "(pass --conn-id %s=%s if it should be)",
                record.where or "a checkpoint", conn_id, provider, ", ".join(map(repr, allowed)), provider, conn_id,
            )  # fmt: skip
    return kept


def checkpoint_rows(database: str | None = None) -> list[CheckpointRow]:
    """Read the checkpoint rows from Airflow's metadata DB (or the SQLAlchemy URL ``database``)."""
    from airflow.models.task_state_store import TaskStateStoreModel as Store
    from sqlalchemy import create_engine, or_, select
    from sqlalchemy.orm import Session

    query = select(Store.key, Store.value, Store.dag_id, Store.run_id, Store.task_id, Store.map_index).where(
        or_(Store.key == SUBMIT_CHECKPOINT, Store.key.like(f"{FOLLOW_UP_PREFIX}%"))
    )
    if database:
        with Session(create_engine(database)) as session:
            return [_row(*found) for found in session.execute(query)]
    from airflow.utils.session import create_session

    with create_session() as session:
        return [_row(*found) for found in session.execute(query)]


def _row(name: Any, value: Any, dag_id: Any, run_id: Any, task_id: Any, map_index: Any) -> CheckpointRow:
    chunk = "" if map_index is None or map_index < 0 else f", chunk {map_index}"
    where = f"the checkpoint of DAG {dag_id!r}, run {run_id!r}, task {task_id!r}{chunk}"
    return CheckpointRow(str(name), value, where)
