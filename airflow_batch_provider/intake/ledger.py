"""What the stream worker remembers across crashes: answers already written, and tries not finished.

Both live in the output database (the sink's connection), so any worker on any host sees them:

- **answered**: the output table itself. A request whose row is ``succeeded`` under the same
  ``request_fingerprint`` (model, parameters and prompt) is not sent again; a crash between
  "rows written" and "ack" costs an ack, not a second bill.
- **tries** (table ``<output>_tries``): per request id, how often a group holding it was sent
  to the model (``tries``), how often it came back with a retryable error (``failures``, with
  the last one), and how often its worker died while it was sent alone (``alone``).
  ``tries - failures`` is the number of crashes it was part of: it sets the size of its next
  group; ``alone`` and ``failures`` decide when it is dead-lettered (:mod:`.worker`) — never the
  queue's delivery count, which SQS raises for lapsed claims and re-reads too. A row is removed
  once its request is acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import sqlalchemy as sa

from airflow_batch_provider.sinks.sql import FINGERPRINT_COLUMN, STATUS_COLUMN, SUCCEEDED, SqlUpsertSink

#: ids per IN (...) query: well under SQLite's and PostgreSQL's bound-parameter limits.
QUERY_BATCH = 500


@dataclass(frozen=True)
class Tries:
    """One request's unfinished history: sends, retryable failures among them, and the last error."""

    tries: int = 0
    failures: int = 0
    last_error: str | None = None
    alone: int = 0  # sends alone (a part of one) that ended in neither a written result nor a known failure

    @property
    def crashes(self) -> int:
        """Sends that ended in neither a written result nor a known failure (the worker died)."""
        return max(0, self.tries - self.failures)


class WorkLedger:
    """Read the output table for answers; keep the ``<table>_tries`` table of unfinished sends."""

    def __init__(self, sink: SqlUpsertSink) -> None:
        self.sink = sink
        self.tries_name = f"{sink.table_name}_tries"

    @cached_property
    def tries_table(self) -> sa.Table:
        """The tries table, created if missing."""
        table = sa.Table(
            self.tries_name,
            sa.MetaData(),
            sa.Column("request_id", sa.String(64), primary_key=True),
            sa.Column("tries", sa.Integer, nullable=False),
            sa.Column("failures", sa.Integer, nullable=False),
            sa.Column("alone", sa.Integer, nullable=False),
            sa.Column("last_error", sa.Text),
            sa.Column("updated_at", sa.Float, nullable=False),
            schema=self.sink.schema,
        )
        table.create(self.sink.engine, checkfirst=True)
        return table

    def answered(self, fingerprints: Mapping[str, str]) -> set[str]:
        """Return the request ids whose ``succeeded`` row carries the given fingerprint."""
        engine = self.sink.engine
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(self.sink.table_name, schema=self.sink.schema):
                return set()
            output = sa.Table(self.sink.table_name, sa.MetaData(), schema=self.sink.schema, autoload_with=conn)
            if FINGERPRINT_COLUMN not in output.c:  # written before fingerprints were kept: answer again
                return set()
            key, found = output.c[self.sink.key], set()
            ids = list(fingerprints)
            for start in range(0, len(ids), QUERY_BATCH):
                query = sa.select(key, output.c[FINGERPRINT_COLUMN]).where(
                    key.in_(ids[start : start + QUERY_BATCH]), output.c[STATUS_COLUMN] == SUCCEEDED
                )
                found |= {str(rid) for rid, fp in conn.execute(query) if fp == fingerprints.get(str(rid))}
        return found

    def read(self, request_ids: Collection[str]) -> dict[str, Tries]:
        """Return the tries of the given ids (absent ones have none)."""
        table, ids, out = self.tries_table, list(request_ids), {}
        with self.sink.engine.connect() as conn:
            for start in range(0, len(ids), QUERY_BATCH):
                query = sa.select(table).where(table.c.request_id.in_(ids[start : start + QUERY_BATCH]))
                for row in conn.execute(query):
                    out[row.request_id] = Tries(row.tries, row.failures, row.last_error, row.alone)
        return out

    def sending(self, request_ids: Collection[str], *, alone: bool = False) -> None:
        """Count one send for each id (and one alone), committed before the first request leaves."""
        self._bump(request_ids, {}, {"tries": 1, "alone": int(alone)})

    def failed(self, errors: Mapping[str, str], *, alone: bool = False) -> None:
        """Count one retryable failure for each id, with its error (a known failure is no crash)."""
        self._bump(errors, errors, {"failures": 1, "alone": -int(alone)})

    def _bump(self, request_ids: Collection[str], errors: Mapping[str, str], deltas: Mapping[str, int]) -> None:
        if not request_ids:
            return
        table, now = self.tries_table, time.time()
        counts = {"tries": 0, "failures": 0, "alone": 0, **deltas}
        rows: list[dict[str, Any]] = [
            {"request_id": rid, **counts, "last_error": errors.get(rid), "updated_at": now} for rid in request_ids
        ]
        statement = _insert(self.sink.engine.dialect.name, table)
        updates: dict[str, Any] = {name: table.c[name] + delta for name, delta in deltas.items() if delta}
        updates["updated_at"] = statement.excluded.updated_at
        if errors:
            updates["last_error"] = statement.excluded.last_error
        with self.sink.engine.begin() as conn:
            conn.execute(statement.on_conflict_do_update(index_elements=["request_id"], set_=updates), rows)

    def forget(self, request_ids: Collection[str]) -> None:
        """Drop the rows of acknowledged requests."""
        table, ids = self.tries_table, list(request_ids)
        with self.sink.engine.begin() as conn:
            for start in range(0, len(ids), QUERY_BATCH):
                conn.execute(sa.delete(table).where(table.c.request_id.in_(ids[start : start + QUERY_BATCH])))


def _insert(dialect: str, table: sa.Table) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:  # the sink only builds postgres and sqlite engines
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    return insert(table)
