"""SqlUpsertSink: upsert merged result parts into a SQL table, one transaction per chunk.

The table is keyed on ``custom_id``: writing the same part twice leaves one row per custom_id
holding the latest values, so a rerun, a retry or a cleared DAG run never duplicates a row. Each
part (one chunk) is written in a single transaction, in ``INSERT ... ON CONFLICT (custom_id) DO
UPDATE`` batches of ``batch_size`` rows; a failure anywhere in the part rolls the whole part back.

Connections (``BaseHook.get_connection``, so ``AIRFLOW_CONN_<ID>`` works):

- ``postgres`` / ``postgresql``: host, port, login, password, schema (= database); the extras
  ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ``application_name``, ``connect_timeout``,
  ``options`` and ``target_session_attrs`` go to libpq; ``sqlalchemy_driver`` (default ``psycopg2``)
  picks the DBAPI driver.
- ``sqlite``: the database file in ``host`` (``{"conn_type": "sqlite", "host": "/data/r.db"}``) or,
  from a URI like ``sqlite:////data/r.db``, in ``schema``. Airflow's ``get_uri()`` is not a URL
  SQLAlchemy accepts for SQLite, so the URL is built here.

Column types come from the Arrow schema of the first part written:

=====================================  ===========================  ============================
Arrow                                  PostgreSQL                   SQLite
=====================================  ===========================  ============================
string                                 TEXT                         TEXT
int8 … int64, uint8 … uint32           BIGINT                       BIGINT (integer)
uint64                                 NUMERIC(20, 0)               NUMERIC
float16, float32                       REAL                         REAL
float64                                DOUBLE PRECISION             DOUBLE (real)
bool                                   BOOLEAN                      BOOLEAN (0/1)
decimal(p, s)                          NUMERIC(p, s)                NUMERIC
timestamp (with / without tz)          TIMESTAMP [WITH TIME ZONE]   DATETIME (ISO text)
date, time, duration                   DATE, TIME, INTERVAL         DATE, TIME, DATETIME
binary                                 BYTEA                        BLOB
list of numbers, strings or bools      a native array: REAL[] …     JSON (text)
(embeddings: list<float32>)            (``embedding::vector``
                                       casts to pgvector)
nested lists, struct, map              JSONB                        JSON (text)
=====================================  ===========================  ============================

Embeddings go to a native ``REAL[]`` on PostgreSQL (exact float32 values, no JSON parsing, and a
direct cast to pgvector) and to a JSON array on SQLite, which has no array type; both read back as
Python lists of floats. The key column is the primary key. A part that brings a column the table
lacks adds it (nullable); columns the part lacks are left as they are. A column whose type changed
(say ``response`` went from text to an embedding array) is refused, and on PostgreSQL NUL
characters are escaped reversibly, their rows marked in ``nul_escaped``: see
:mod:`airflow_batch_provider.sinks.sql_types`. Column names with a NUL or other control character, and
on PostgreSQL names over 63 bytes, are refused before the database is touched (the chunk step refuses
them before anything is paid for: :mod:`airflow_batch_provider.chunking.column_names`).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from airflow_batch_provider.exceptions import SinkError
from airflow_batch_provider.sinks.sql_types import (
    NUL_ESCAPED_COLUMN,
    check_column_types,
    check_exact_in_float,
    column_type,
    escape_nul,
)

__all__ = ["SinkError", "SqlUpsertSink", "column_type", "engine_url"]

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are cut
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

DEFAULT_BATCH_SIZE = 5000
FINGERPRINT_COLUMN = "request_fingerprint"
STATUS_COLUMN = "status"
SUCCEEDED = "succeeded"
_POSTGRES_TYPES = frozenset({"postgres", "postgresql"})
_LIBPQ_EXTRAS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "connect_timeout",
    "options",
    "target_session_attrs",
)


# -- connection → engine -----------------------------------------------------------------------------


def engine_url(conn: Any) -> URL:
    """Build the SQLAlchemy URL of an Airflow connection (``postgres``/``postgresql`` or ``sqlite``)."""
    conn_type = (conn.conn_type or "").lower()
    extra = conn.extra_dejson or {}
    if conn_type in _POSTGRES_TYPES:
        driver = str(extra.get("sqlalchemy_driver") or "psycopg2")
        query = {key: str(extra[key]) for key in _LIBPQ_EXTRAS if extra.get(key) not in (None, "")}
        return URL.create(
            f"postgresql+{driver}",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host or None,
            port=conn.port or None,
            database=conn.schema or None,
            query=query,
        )
    if conn_type == "sqlite":
        path = (conn.host or conn.schema or "").strip()
        if not path or path == ":memory:":
            raise SinkError(
                f"Connection {conn.conn_id!r} (sqlite) names no database file: put its path in the host field, "
                'e.g. AIRFLOW_CONN_X=\'{"conn_type": "sqlite", "host": "/data/results.db"}\'.'
            )
        return URL.create("sqlite", database=path)
    raise SinkError(
        f"Connection {conn.conn_id!r} has type {conn.conn_type!r}; SqlUpsertSink supports postgres and sqlite."
    )


# -- the sink ----------------------------------------------------------------------------------------


class SqlUpsertSink:
    """Upsert merged parts (Arrow tables) into ``table`` through the Airflow connection ``conn_id``.

    Nothing connects until the first write or read, so building one in a DAG file is free.

    :param conn_id: an Airflow connection of type ``postgres`` or ``sqlite``.
    :param table: table name; ``"schema.table"`` names a PostgreSQL schema (which must exist).
    :param key: the unique key column (the primary key of a table this sink creates).
    :param batch_size: rows per ``INSERT ... ON CONFLICT`` execution (all in one transaction per part).
    """

    def __init__(
        self, conn_id: str, table: str, *, key: str = "custom_id", batch_size: int = DEFAULT_BATCH_SIZE
    ) -> None:
        if not conn_id:
            raise SinkError("SqlUpsertSink needs a conn_id.")
        if not table or not table.strip():
            raise SinkError("SqlUpsertSink needs a table name.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise SinkError(f"batch_size={batch_size!r} must be a positive integer.")
        self.conn_id = conn_id
        schema, _, name = table.strip().rpartition(".")
        self.schema = schema or None
        self.table_name = name
        self.key = key
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"SqlUpsertSink(conn_id={self.conn_id!r}, table={self.qualified_name!r}, key={self.key!r})"

    @property
    def qualified_name(self) -> str:
        """``schema.table`` or ``table``."""
        return f"{self.schema}.{self.table_name}" if self.schema else self.table_name

    @cached_property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, built once from the connection (no pooled connections are kept)."""
        from airflow.sdk import BaseHook

        url = engine_url(BaseHook.get_connection(self.conn_id))
        connect_args: dict[str, Any] = {"timeout": 30} if url.get_backend_name() == "sqlite" else {}
        return sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)

    def dispose(self) -> None:
        """Release the engine (a later call builds it again)."""
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            engine.dispose()

    # writing ---------------------------------------------------------------------------------------

    def write_part(self, table: pa.Table, chunk_index: int) -> int:
        """Upsert one merged part in one transaction; return the number of rows written.

        Rows are checked before the database is touched: the key column must exist and hold
        unique, non-null values. A database error rolls back every row of the part and is
        raised as :class:`SinkError` naming the table and chunk.
        """
        where = f"chunk {chunk_index} → {self.qualified_name}"
        self._check_part(table, where)
        if table.num_rows == 0:
            log.info("%s: empty part, nothing to write", where)
            return 0
        started = time.monotonic()
        postgres = self.engine.dialect.name == "postgresql"
        if postgres:  # its text cannot hold U+0000: see sql_types
            table = _escape_nul(table, self.key, where)
        try:
            target = self._ensure_table(table.schema, where)
            if postgres and NUL_ESCAPED_COLUMN in target.c and NUL_ESCAPED_COLUMN not in table.column_names:
                # Rows written escaped before are written plainly now: clear their mark with them.
                table = table.append_column(NUL_ESCAPED_COLUMN, pa.nulls(table.num_rows, pa.string()))
            check_exact_in_float(target, table, self.key, where)
            statement = self._upsert_statement(target, table.column_names)
            batches = 0
            with self.engine.begin() as conn:
                for rows in self._row_batches(table):
                    conn.execute(statement, rows)
                    batches += 1
        except (sa.exc.SQLAlchemyError, ValueError, TypeError, OverflowError) as exc:
            # The driver raises plain ValueError/TypeError for values it cannot send (not wrapped by SQLAlchemy).
            raise SinkError(f"{where}: the part was not written (rolled back): {_short(exc)}") from exc
        log.info(
            "%s: upserted %d rows in %d batch(es), one transaction, %.2f s",
            where,
            table.num_rows,
            batches,
            time.monotonic() - started,
        )
        return table.num_rows

    def _check_part(self, table: pa.Table, where: str) -> None:
        if self.key not in table.column_names:
            raise SinkError(f"{where}: the part has no key column {self.key!r} (columns: {table.column_names}).")
        if len(set(table.column_names)) != len(table.column_names):
            raise SinkError(f"{where}: the part has duplicate column names: {table.column_names}.")
        keys = table.column(self.key)
        if keys.null_count:
            raise SinkError(f"{where}: {keys.null_count} row(s) have a null {self.key!r}.")
        counts = Counter(keys.to_pylist())
        if len(counts) != table.num_rows:
            dups = sorted((value for value, n in counts.items() if n > 1), key=str)
            raise SinkError(f"{where}: {len(dups)} {self.key!r} value(s) occur twice in one part: {dups[:10]}")
        for field in table.schema:
            column_type(field.type)  # fail before touching the database
        self._check_names(table.column_names, where)

    def _check_names(self, names: list[str], where: str) -> None:
        """Refuse column names the database cannot hold as they are (the chunk step refuses them earlier)."""
        postgres = self.engine.dialect.name == "postgresql"
        for name in names:
            if _CONTROL.search(name):
                raise SinkError(f"{where}: column {name!r} has a NUL or other control character in its name.")
            if postgres and len(name.encode("utf-8")) > MAX_NAME_BYTES:
                raise SinkError(
                    f"{where}: column {name!r} has a name over {MAX_NAME_BYTES} bytes, which PostgreSQL would cut."
                )
        if postgres and NUL_ESCAPED_COLUMN in names:
            raise SinkError(f"{where}: the part has a column {NUL_ESCAPED_COLUMN!r}, which the sink writes itself.")

    def _row_batches(self, table: pa.Table) -> Iterator[list[dict[str, Any]]]:
        for batch in table.to_batches(max_chunksize=self.batch_size):
            if batch.num_rows:
                yield batch.to_pylist()

    def _has_table(self) -> bool:
        with self.engine.connect() as conn:
            return bool(sa.inspect(conn).has_table(self.table_name, schema=self.schema))

    def _ensure_table(self, schema: pa.Schema, where: str) -> sa.Table:
        """Create the table if missing, or add the part's missing columns; return it reflected.

        A column whose type no longer fits the table is refused first (see
        :func:`~airflow_batch_provider.sinks.sql_types.check_column_types`). Schema changes run in
        their own transactions before the data's: a part that then fails leaves at most an empty
        table or a new, empty column behind.
        """
        if not self._has_table():
            self._create(schema)
        with self.engine.begin() as conn:
            target = self._reflect(conn)
            check_column_types(target, schema, conn.dialect, where)
            missing = [f for f in schema if f.name not in target.c]
            if missing:
                prep = conn.dialect.identifier_preparer
                table_sql = prep.format_table(target)
                for f in missing:
                    ddl = column_type(f.type).compile(dialect=conn.dialect)
                    conn.execute(sa.text(f"ALTER TABLE {table_sql} ADD COLUMN {prep.quote(f.name)} {ddl}"))
                log.info("%s: added column(s) %s", self.qualified_name, [f.name for f in missing])
                target = self._reflect(conn)
            self._check_key_is_unique(conn)
        return target

    def _create(self, schema: pa.Schema) -> None:
        columns = [
            sa.Column(f.name, column_type(f.type), primary_key=f.name == self.key, nullable=f.name != self.key)
            for f in schema
        ]
        table = sa.Table(self.table_name, sa.MetaData(), *columns, schema=self.schema)
        try:
            with self.engine.begin() as conn:
                table.create(conn)
        except sa.exc.DBAPIError:
            # Another task created it between our check and our CREATE: use theirs.
            if not self._has_table():
                raise
            return
        log.info("%s: created table keyed on %s", self.qualified_name, self.key)

    def _reflect(self, conn: Connection) -> sa.Table:
        return sa.Table(self.table_name, sa.MetaData(), schema=self.schema, autoload_with=conn)

    def _check_key_is_unique(self, conn: Connection) -> None:
        inspector = sa.inspect(conn)
        keyed: list[list[Any]] = [
            list(inspector.get_pk_constraint(self.table_name, schema=self.schema).get("constrained_columns") or [])
        ]
        keyed += [
            list(u["column_names"]) for u in inspector.get_unique_constraints(self.table_name, schema=self.schema)
        ]
        keyed += [
            list(i["column_names"]) for i in inspector.get_indexes(self.table_name, schema=self.schema) if i["unique"]
        ]
        if [self.key] not in keyed:
            raise SinkError(
                f"Table {self.qualified_name} has no primary key or unique index on ({self.key}) alone, which "
                f"ON CONFLICT ({self.key}) needs; add one or let SqlUpsertSink create the table."
            )

    def _upsert_statement(self, target: sa.Table, columns: list[str]) -> Any:
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        else:  # engine_url only builds these two
            raise SinkError(f"{self.qualified_name}: dialect {dialect!r} has no upsert support here.")
        statement = insert(target)
        updates = {name: statement.excluded[name] for name in columns if name != self.key}
        if not updates:
            return statement.on_conflict_do_nothing(index_elements=[self.key])
        return statement.on_conflict_do_update(index_elements=[self.key], set_=updates)

    # reading ---------------------------------------------------------------------------------------

    def read_fingerprints(self) -> dict[str, str]:
        """Return ``{custom_id: request_fingerprint}`` of the rows whose status is ``succeeded``.

        An absent table gives ``{}``. Used to send only new or changed rows on the next run.
        """
        try:
            with self.engine.connect() as conn:
                if not sa.inspect(conn).has_table(self.table_name, schema=self.schema):
                    return {}
                target = self._reflect(conn)
                needed = {self.key, FINGERPRINT_COLUMN, STATUS_COLUMN}
                if not needed <= set(target.c.keys()):
                    raise SinkError(
                        f"Table {self.qualified_name} lacks column(s) {sorted(needed - set(target.c.keys()))}; "
                        "it was not written by SqlUpsertSink from merged results."
                    )
                query = sa.select(target.c[self.key], target.c[FINGERPRINT_COLUMN]).where(
                    target.c[STATUS_COLUMN] == SUCCEEDED
                )
                return {str(key): str(fp) for key, fp in conn.execute(query) if fp is not None}
        except sa.exc.SQLAlchemyError as exc:
            raise SinkError(f"{self.qualified_name}: could not read fingerprints: {_short(exc)}") from exc


def _escape_nul(table: pa.Table, key: str, where: str) -> pa.Table:
    """Escape the NUL characters of ``table`` for PostgreSQL (see sql_types) and say so in the log."""
    table, escaped, first = escape_nul(table, key)
    if escaped:
        log.warning(
            "%s: escaped NUL characters (which PostgreSQL text cannot hold) in %d value(s), e.g. in %s %r; their "
            "rows name those columns in %r (decode with sinks.sql_types.decode_nul); the parquet part keeps them "
            "as they are",
            where,
            escaped,
            key,
            first,
            NUL_ESCAPED_COLUMN,
        )
    return table


def _short(exc: BaseException, limit: int = 500) -> str:
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return text if len(text) <= limit else text[:limit] + "…"
