"""SqlUpsertSink against a real PostgreSQL (a throwaway database) and SQLite, connections from AIRFLOW_CONN_*."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy as sa
from airflow.sdk import Connection

from airflow_batch_provider.sinks.sql import SinkError, SqlUpsertSink, column_type, engine_url
from airflow_batch_provider.sinks.sql_types import decode_nul
from tests.scheduler.postgres import PG_HOST, PG_PORT, PG_USER, create_database, drop_database, sqlalchemy_url


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """A throwaway PostgreSQL database for this module, dropped at the end."""
    try:
        name = create_database("abp_sink")
    except Exception as exc:  # psycopg2.OperationalError and friends
        pytest.fail(f"these tests need PostgreSQL on {PG_HOST}:{PG_PORT} (user {PG_USER}): {exc}")
    yield name
    drop_database(name)


@dataclass
class Backend:
    """One database the sink writes to, with its own engine to look at the results."""

    name: str
    conn_id: str
    table: str
    engine: sa.Engine

    def sink(self, **kwargs: Any) -> SqlUpsertSink:
        return SqlUpsertSink(self.conn_id, self.table, **kwargs)

    def rows(self, table: str | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            target = sa.Table(table or self.table, sa.MetaData(), autoload_with=conn)
            result = conn.execute(sa.select(target).order_by(target.c.custom_id))
            return [dict(row._mapping) for row in result]

    def has_table(self) -> bool:
        with self.engine.connect() as conn:
            return bool(sa.inspect(conn).has_table(self.table))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """The sink's connection, set as ``AIRFLOW_CONN_<ID>``: a SQLite file (URI form) or PostgreSQL (JSON form)."""
    conn_id = f"results_{uuid.uuid4().hex[:8]}"
    table = f"results_{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        path = tmp_path / "results.db"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", f"sqlite:///{path}")
        engine = sa.create_engine(f"sqlite:///{path}")
    else:
        database = request.getfixturevalue("pg_database")
        conn = {"conn_type": "postgres", "host": PG_HOST, "port": PG_PORT, "login": PG_USER, "schema": database}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
        engine = sa.create_engine(sqlalchemy_url(database), poolclass=sa.pool.NullPool)
    yield Backend(request.param, conn_id, table, engine)
    engine.dispose()


def merged_part(ids: list[str], *, answer: str = "ok", fingerprint: str = "fp1", **overrides: Any) -> pa.Table:
    """A merged part as MergeResultsOperator writes it: source columns, custom_id, fingerprint, results."""
    n = len(ids)
    columns: dict[str, Any] = {
        "product_id": pa.array(ids),
        "title": pa.array([f"title {i}" for i in ids]),
        "price": pa.array([1.5 * k for k in range(n)], pa.float64()),
        "custom_id": pa.array(ids),
        "request_fingerprint": pa.array([fingerprint] * n),
        "status": pa.array(["succeeded"] * n),
        "response": pa.array([f"{answer} {i}" for i in ids]),
        "finish_reason": pa.array(["stop"] * n),
        "error": pa.array([None] * n, pa.string()),
        "input_tokens": pa.array([10 + k for k in range(n)], pa.int64()),
        "output_tokens": pa.array([2] * n, pa.int64()),
        "batch_id": pa.array(["batch_1"] * n),
    }
    for name, values in overrides.items():
        columns[name] = values if isinstance(values, pa.Array) else pa.array(values)
    return pa.table(columns)


# -- writing -----------------------------------------------------------------------------------------


def test_first_write_creates_the_table_keyed_on_custom_id(backend: Backend) -> None:
    part = merged_part(["a", "b", "c"])
    assert backend.sink().write_part(part, 0) == 3
    with backend.engine.connect() as conn:
        inspector = sa.inspect(conn)
        assert inspector.get_pk_constraint(backend.table)["constrained_columns"] == ["custom_id"]
        assert [c["name"] for c in inspector.get_columns(backend.table)] == part.column_names
    assert backend.rows() == part.to_pylist()


def test_writing_again_updates_rows_in_place(backend: Backend) -> None:
    sink = backend.sink(batch_size=2)
    first = merged_part(["a", "b", "c"])
    sink.write_part(first, 0)
    sink.write_part(first, 0)  # a rerun of the same chunk
    assert backend.rows() == first.to_pylist()
    second = merged_part(["b", "c", "d"], answer="new", fingerprint="fp2")
    assert sink.write_part(second, 1) == 3
    rows = {r["custom_id"]: r for r in backend.rows()}
    assert sorted(rows) == ["a", "b", "c", "d"]  # one row per custom_id
    assert rows["a"]["response"] == "ok a" and rows["a"]["request_fingerprint"] == "fp1"
    assert rows["b"]["response"] == "new b" and rows["b"]["request_fingerprint"] == "fp2"
    assert rows["d"]["response"] == "new d"


def test_a_failure_in_the_last_batch_rolls_back_the_whole_part(backend: Backend) -> None:
    """The table says ``response NOT NULL``; the part's last row breaks it after three batches went in."""
    good = merged_part(["a", "b", "c"])
    columns = [
        sa.Column(f.name, column_type(f.type), primary_key=f.name == "custom_id", nullable=f.name != "response")
        for f in good.schema
    ]
    sa.Table(backend.table, sa.MetaData(), *columns).create(backend.engine)
    sink = backend.sink(batch_size=2)
    sink.write_part(good, 0)
    before = backend.rows()

    ids = ["a", "b", "c", "d", "e", "f", "g"]  # updates and new rows; batches of 2, 2, 2, 1
    bad = merged_part(ids, response=pa.array([*(f"changed {i}" for i in ids[:-1]), None], pa.string()))
    inserts: list[str] = []
    sa.event.listen(
        sink.engine, "before_cursor_execute", lambda *args: inserts.append(args[2]) if "INSERT" in args[2] else None
    )
    with pytest.raises(SinkError, match=rf"chunk 3 → {backend.table}: the part was not written \(rolled back\)"):
        sink.write_part(bad, 3)
    assert len(inserts) >= 4  # the earlier batches really ran before the failure
    assert backend.rows() == before


BAD_PARTS = [
    pytest.param(lambda: merged_part(["a"]).drop_columns(["custom_id"]), "no key column 'custom_id'", id="no-key"),
    pytest.param(
        lambda: merged_part(["a", "b"], custom_id=pa.array(["a", None])), "1 row\\(s\\) have a null", id="null-key"
    ),
    pytest.param(
        lambda: merged_part(["a", "b", "c"], custom_id=["a", "b", "a"]), "occur twice in one part: \\['a'\\]", id="dup"
    ),
    pytest.param(
        lambda: merged_part(["a"], odd=pa.array([(1, 2, 3)], pa.month_day_nano_interval())),
        "has no SQL column type",
        id="unsupported-type",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD_PARTS)
def test_bad_parts_are_refused_before_the_database_is_touched(backend: Backend, make: Any, message: str) -> None:
    with pytest.raises(SinkError, match=message):
        backend.sink().write_part(make(), 7)
    assert not backend.has_table()


LONG_NAME = "description_" + "x" * 52  # 64 bytes: PostgreSQL would keep 63 of them


@pytest.mark.parametrize(
    ("columns", "message", "refused_on"),
    [
        pytest.param({LONG_NAME: ["v"]}, "has a name over 63 bytes", {"postgres"}, id="64-bytes"),
        pytest.param(
            {LONG_NAME: ["v"], LONG_NAME[:-1] + "y": ["w"]}, "over 63 bytes", {"postgres"}, id="same-63-byte-prefix"
        ),
        pytest.param({"ti\x00tle": ["v"]}, "NUL or other control character", {"postgres", "sqlite"}, id="nul"),
        pytest.param({"nul_escaped": ["v"]}, "which the sink writes itself", {"postgres"}, id="own-column"),
    ],
)
def test_column_names_the_database_cannot_hold_are_refused_before_it_is_touched(
    backend: Backend, columns: dict[str, list[str]], message: str, refused_on: set[str]
) -> None:
    """Before this check PostgreSQL failed them half-way: ``already exists`` / ``unterminated quoted identifier``."""
    part = merged_part(["a"], **columns)
    if backend.name not in refused_on:  # SQLite has no name length limit
        assert backend.sink().write_part(part, 2) == 1
        return
    with pytest.raises(SinkError, match=f"chunk 2 → {backend.table}: .*{message}"):
        backend.sink().write_part(part, 2)
    assert not backend.has_table()


def test_an_empty_part_writes_nothing(backend: Backend) -> None:
    assert backend.sink().write_part(merged_part([]), 0) == 0
    assert not backend.has_table()


def test_a_part_with_new_columns_adds_them(backend: Backend) -> None:
    sink = backend.sink()
    sink.write_part(merged_part(["a"]), 0)
    sink.write_part(merged_part(["b"], label=["toys"], confidence=pa.array([0.5], pa.float64())), 1)
    rows = {r["custom_id"]: r for r in backend.rows()}
    assert (rows["a"]["label"], rows["a"]["confidence"]) == (None, None)
    assert (rows["b"]["label"], rows["b"]["confidence"]) == ("toys", 0.5)


def test_nul_characters_in_answers_are_kept_reversibly_and_marked(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """A model answer can hold U+0000, which PostgreSQL text cannot: never dropped, escaped and marked there."""
    answers = ["plain \\0 backslash", "nul\x00inside \\0", "two\x00\x00nuls"]
    part = merged_part(
        ["a", "b", "c"],
        response=answers,
        tags=pa.array([["x\x00y"], ["ok"], []], pa.list_(pa.string())),
        meta=pa.array([{"k": "v\x00"}, {"k": "v"}, {"k": None}], pa.struct([("k", pa.string())])),
    )
    caplog.set_level("WARNING")
    assert backend.sink().write_part(part, 4) == 3
    rows = {r["custom_id"]: r for r in backend.rows()}
    if backend.name == "sqlite":  # SQLite stores NUL as it is
        assert [rows[k]["response"] for k in "abc"] == answers
        assert "nul_escaped" not in rows["a"]
        return
    assert rows["a"]["response"] == answers[0], "a value without NUL is written as it is, backslashes included"
    assert [rows[k]["nul_escaped"] for k in "abc"] == ["tags,meta", "response", "response"]
    assert [decode_nul(rows[k]["response"]) for k in "bc"] == answers[1:]
    assert [decode_nul(t) for t in rows["a"]["tags"]] == ["x\x00y"] and decode_nul(rows["a"]["meta"]["k"]) == "v\x00"
    assert f"chunk 4 → {backend.table}: escaped NUL characters" in caplog.text
    assert "in 4 value(s), e.g. in custom_id 'a'" in caplog.text
    # A rerun whose answers hold no NUL writes them plainly and clears the marks.
    backend.sink().write_part(merged_part(["a", "b", "c"], answer="clean"), 5)
    rows = {r["custom_id"]: r for r in backend.rows()}
    assert [(rows[k]["response"], rows[k]["nul_escaped"]) for k in "abc"] == [(f"clean {k}", None) for k in "abc"]


def test_a_column_type_change_is_refused_naming_the_column(backend: Backend) -> None:
    """A job switched from chat to embeddings must not write '{0.1,…}' text into the TEXT column."""
    sink = backend.sink()
    sink.write_part(merged_part(["a", "b"]), 0)
    vectors = pa.array([[0.1, 0.2], [0.3, 0.4]], pa.list_(pa.float32()))
    with pytest.raises(SinkError, match=f"chunk 1 → {backend.table}: column 'response' is ") as info:
        sink.write_part(merged_part(["a", "b"], response=vectors), 1)
    assert "list<item: float>" in str(info.value) and "write to a new table" in str(info.value)
    assert [r["response"] for r in backend.rows()] == ["ok a", "ok b"]  # nothing written
    # Widening an integer column's values into an existing floating column is fine.
    sink.write_part(merged_part(["c"], price=pa.array([3], pa.int64())), 2)
    assert [r["price"] for r in backend.rows()][-1] == 3.0


def test_an_existing_table_without_a_unique_key_is_refused(backend: Backend) -> None:
    sa.Table(backend.table, sa.MetaData(), sa.Column("custom_id", sa.Text), sa.Column("status", sa.Text)).create(
        backend.engine
    )
    with pytest.raises(SinkError, match="no primary key or unique index on \\(custom_id\\)"):
        backend.sink().write_part(merged_part(["a"]), 0)


# -- types -------------------------------------------------------------------------------------------

EMBEDDING = [[0.1, -0.25, 3.0], [1e-3, 0.0, -1.5]]


def typed_part() -> pa.Table:
    when = dt.datetime(2026, 5, 1, 12, 30, tzinfo=dt.UTC)
    return pa.table(
        {
            "custom_id": ["a", "b"],
            "text": ["héllo", None],
            "small": pa.array([1, -2], pa.int32()),
            "big": pa.array([2**40, None], pa.int64()),
            "ratio": pa.array([0.25, None], pa.float64()),
            "score": pa.array([0.5, 1.25], pa.float32()),
            "flag": [True, False],
            "amount": pa.array([decimal.Decimal("12.34"), None], pa.decimal128(10, 2)),
            "day": pa.array([dt.date(2026, 5, 1), None], pa.date32()),
            "at": pa.array([when, None], pa.timestamp("us", tz="UTC")),
            "raw": pa.array([b"\x00\x01", None], pa.binary()),
            "embedding": pa.array(EMBEDDING, pa.list_(pa.float32())),
            "tags": pa.array([["x", "y"], []], pa.list_(pa.string())),
            "meta": pa.array([{"k": 1, "v": "one"}, None], pa.struct([("k", pa.int64()), ("v", pa.string())])),
            "matrix": pa.array([[[1, 2], [3]], None], pa.list_(pa.list_(pa.int64()))),
        }
    )


EXPECTED_TYPES = {
    "postgres": {
        "custom_id": "TEXT",
        "text": "TEXT",
        "small": "BIGINT",
        "big": "BIGINT",
        "ratio": "DOUBLE PRECISION",
        "score": "REAL",
        "flag": "BOOLEAN",
        "amount": "NUMERIC(10, 2)",
        "day": "DATE",
        "at": "TIMESTAMP WITH TIME ZONE",
        "raw": "BYTEA",
        "embedding": "REAL[]",
        "tags": "TEXT[]",
        "meta": "JSONB",
        "matrix": "JSONB",
    },
    "sqlite": {
        "custom_id": "TEXT",
        "text": "TEXT",
        "small": "BIGINT",
        "big": "BIGINT",
        "ratio": "DOUBLE",
        "score": "REAL",
        "flag": "BOOLEAN",
        "amount": "NUMERIC(10, 2)",
        "day": "DATE",
        "at": "DATETIME",
        "raw": "BLOB",
        "embedding": "JSON",
        "tags": "JSON",
        "meta": "JSON",
        "matrix": "JSON",
    },
}


def test_arrow_types_map_to_sql_columns_and_read_back(backend: Backend) -> None:
    part = typed_part()
    backend.sink().write_part(part, 0)
    with backend.engine.connect() as conn:
        columns = sa.inspect(conn).get_columns(backend.table)
        got = {c["name"]: str(c["type"].compile(dialect=conn.dialect)) for c in columns}
    assert got == EXPECTED_TYPES[backend.name]
    a, b = backend.rows()
    assert (a["text"], a["small"], a["big"], a["ratio"], a["score"], a["flag"]) == ("héllo", 1, 2**40, 0.25, 0.5, True)
    assert (b["text"], b["big"], b["ratio"], b["flag"]) == (None, None, None, False)
    assert a["amount"] == decimal.Decimal("12.34") and a["day"] == dt.date(2026, 5, 1)
    assert a["at"].replace(tzinfo=None) == dt.datetime(2026, 5, 1, 12, 30)
    assert bytes(a["raw"]) == b"\x00\x01"
    for row, vector in zip((a, b), EMBEDDING):
        assert isinstance(row["embedding"], list)
        np.testing.assert_array_equal(np.array(row["embedding"], np.float32), np.array(vector, np.float32))
    assert (a["tags"], b["tags"]) == (["x", "y"], [])
    assert (a["meta"], b["meta"]) == ({"k": 1, "v": "one"}, None)
    assert a["matrix"] == [[1, 2], [3]]


# -- fingerprints ------------------------------------------------------------------------------------


def test_read_fingerprints_returns_succeeded_rows_only(backend: Backend) -> None:
    sink = backend.sink()
    assert sink.read_fingerprints() == {}  # no table yet
    part = merged_part(
        ["a", "b", "c"],
        status=["succeeded", "errored", "succeeded"],
        request_fingerprint=["fa", "fb", "fc"],
    )
    sink.write_part(part, 0)
    assert sink.read_fingerprints() == {"a": "fa", "c": "fc"}


def test_read_fingerprints_needs_merged_results(backend: Backend) -> None:
    sa.Table(backend.table, sa.MetaData(), sa.Column("custom_id", sa.Text, primary_key=True)).create(backend.engine)
    with pytest.raises(SinkError, match="lacks column\\(s\\) \\['request_fingerprint', 'status'\\]"):
        backend.sink().read_fingerprints()


# -- PostgreSQL specifics ----------------------------------------------------------------------------


def test_schema_qualified_table_on_postgres(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PG_URI", f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{pg_database}")
    engine = sa.create_engine(sqlalchemy_url(pg_database), poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS llm"))
    sink = SqlUpsertSink("pg_uri", "llm.classified")
    assert sink.qualified_name == "llm.classified"
    sink.write_part(merged_part(["a", "b"]), 0)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM llm.classified")).scalar() == 2
    engine.dispose()


# -- connections and arguments -----------------------------------------------------------------------

URLS = [
    pytest.param(
        Connection(
            conn_id="c",
            conn_type="postgres",
            host="db.internal",
            port=5433,
            login="u",
            password="p@ss",
            schema="llm",
            extra=json.dumps({"sslmode": "require", "unrelated": "x"}),
        ),
        "postgresql+psycopg2://u:***@db.internal:5433/llm?sslmode=require",
        id="postgres-json",
    ),
    pytest.param(
        Connection(conn_id="c", conn_type="postgresql", host="h", extra=json.dumps({"sqlalchemy_driver": "psycopg"})),
        "postgresql+psycopg://h",
        id="postgresql-driver",
    ),
    pytest.param(
        Connection(conn_id="c", conn_type="sqlite", host="/data/r.db"), "sqlite:////data/r.db", id="sqlite-host"
    ),
    pytest.param(Connection(conn_id="c", conn_type="sqlite", schema="rel.db"), "sqlite:///rel.db", id="sqlite-schema"),
]


@pytest.mark.parametrize(("conn", "url"), URLS)
def test_engine_url_from_a_connection(conn: Connection, url: str) -> None:
    assert engine_url(conn).render_as_string(hide_password=True) == url


@pytest.mark.parametrize(
    ("conn", "message"),
    [
        pytest.param(Connection(conn_id="c", conn_type="sqlite"), "names no database file", id="sqlite-no-path"),
        pytest.param(Connection(conn_id="c", conn_type="mysql", host="h"), "supports postgres and sqlite", id="mysql"),
    ],
)
def test_unusable_connections_are_refused(conn: Connection, message: str) -> None:
    with pytest.raises(SinkError, match=message):
        engine_url(conn)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"batch_size": 0}, "batch_size=0", id="zero-batch"),
        pytest.param({"batch_size": True}, "batch_size=True", id="bool-batch"),
        pytest.param({"table": " "}, "needs a table name", id="no-table"),
        pytest.param({"conn_id": ""}, "needs a conn_id", id="no-conn"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"conn_id": "c", "table": "t", **kwargs}
    with pytest.raises(SinkError, match=message):
        SqlUpsertSink(args.pop("conn_id"), args.pop("table"), **args)


def test_construction_does_not_connect() -> None:
    sink = SqlUpsertSink("no_such_connection", "t")  # as in a DAG file: parsed often, never connected
    assert "engine" not in sink.__dict__
    assert repr(sink) == "SqlUpsertSink(conn_id='no_such_connection', table='t', key='custom_id')"
