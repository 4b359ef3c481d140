"""Column types of SqlUpsertSink: Arrow → SQL (the table in :mod:`airflow_batch_provider.sinks.sql`), the
check that a part still fits an existing table, and the rule for NUL characters on PostgreSQL.

**Type changes are refused.** Columns are typed from the first part written. A later part whose column
would need another kind of SQL column (text → array, number → text, ...) fails with SinkError before
any row is written: writing on would store ``'{0.1,…}'`` text in a TEXT column (a job switched from chat
to embeddings) or fail row by row. Widening an integer into an existing floating or numeric column is
allowed while every value converts exactly (an int64 over 2**53 would silently lose digits in a double
column: such a part is refused, naming the row); so is an all-null column of any type.

**NUL characters on PostgreSQL.** PostgreSQL text (and JSONB) cannot hold U+0000, which a model answer
can contain. The sink removes it from every string it writes there — text columns, strings inside
arrays and JSON — and logs how many values it changed, naming the first custom_id. The parquet part
keeps the exact answer. SQLite stores NUL as it is.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeEngine

from airflow_batch_provider.exceptions import SinkError

NUL = "\x00"


def _array_item_type(item: pa.DataType) -> TypeEngine[Any] | None:
    """Return the PostgreSQL array element type for a list item type, or None when it needs JSON."""
    if pa.types.is_dictionary(item):
        item = item.value_type
    if pa.types.is_float16(item) or pa.types.is_float32(item):
        return sa.REAL()
    if pa.types.is_float64(item):
        return sa.Double()
    if pa.types.is_integer(item) and not pa.types.is_uint64(item):
        return sa.BigInteger()
    if pa.types.is_boolean(item):
        return sa.Boolean()
    if pa.types.is_string(item) or pa.types.is_large_string(item):
        return sa.Text()
    return None


def _list_type(dtype: pa.DataType) -> TypeEngine[Any]:
    item = _array_item_type(dtype.value_type)
    if item is not None:
        return sa.JSON().with_variant(postgresql.ARRAY(item), "postgresql")
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _is_any(*checks: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    return lambda dtype: any(check(dtype) for check in checks)


# Arrow type test → SQLAlchemy type, first match wins: the table of sinks.sql's docstring, in code.
_COLUMN_TYPES: tuple[tuple[Callable[[pa.DataType], bool], Callable[[pa.DataType], TypeEngine[Any]]], ...] = (
    (_is_any(pa.types.is_string, pa.types.is_large_string, pa.types.is_null), lambda _: sa.Text()),
    (pa.types.is_boolean, lambda _: sa.Boolean()),
    (pa.types.is_uint64, lambda _: sa.Numeric(20, 0)),
    (pa.types.is_integer, lambda _: sa.BigInteger()),
    (_is_any(pa.types.is_float16, pa.types.is_float32), lambda _: sa.REAL()),
    (pa.types.is_floating, lambda _: sa.Double()),
    (pa.types.is_decimal, lambda t: sa.Numeric(t.precision, t.scale)),
    (pa.types.is_timestamp, lambda t: sa.DateTime(timezone=t.tz is not None)),
    (pa.types.is_date, lambda _: sa.Date()),
    (pa.types.is_time, lambda _: sa.Time()),
    (pa.types.is_duration, lambda _: sa.Interval()),
    (_is_any(pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary), lambda _: sa.LargeBinary()),
    (_is_any(pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list), _list_type),
    (_is_any(pa.types.is_struct, pa.types.is_map), lambda _: sa.JSON().with_variant(postgresql.JSONB(), "postgresql")),
)


def column_type(dtype: pa.DataType) -> TypeEngine[Any]:
    """Return the SQLAlchemy type for an Arrow type (see sinks.sql's table); raise SinkError if unsupported."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    for matches, make in _COLUMN_TYPES:
        if matches(dtype):
            return make(dtype)
    raise SinkError(f"Arrow type {dtype} has no SQL column type in SqlUpsertSink; cast the column first.")


def _family(sql_type: TypeEngine[Any]) -> type | None:
    """Return the Python type a SQL column holds (list, dict, str, int, ...), or None when unknown."""
    try:
        python_type = sql_type.python_type
    except NotImplementedError:
        return None
    return python_type if isinstance(python_type, type) else None


_WIDENS = {(int, float), (int, decimal.Decimal), (dt.date, dt.datetime)}


def check_column_types(existing: sa.Table, schema: pa.Schema, dialect: Any, where: str) -> None:
    """Raise SinkError when a column of ``schema`` needs another kind of SQL column than ``existing`` has."""
    for field in schema:
        if field.name not in existing.c or pa.types.is_null(field.type):
            continue
        have_type = existing.c[field.name].type
        want_type = column_type(field.type).dialect_impl(dialect)
        have, want = _family(have_type), _family(want_type)
        if have is None or want is None or have is want or (want, have) in _WIDENS:
            continue
        raise SinkError(
            f"{where}: column {field.name!r} is {have_type.compile(dialect=dialect)} in the table, but this part "
            f"holds {field.type} ({want_type.compile(dialect=dialect)}). The job now writes something else into it "
            "(e.g. chat answers became embeddings); write to a new table, or drop or rename that column first."
        )


def check_exact_in_float(existing: sa.Table, table: pa.Table, key: str, where: str) -> None:
    """Raise SinkError when an integer of ``table`` goes into a floating column of ``existing`` and loses digits."""
    for field in table.schema:
        if field.name not in existing.c or not pa.types.is_integer(field.type):
            continue
        if _family(existing.c[field.name].type) is not float:
            continue
        values = pc.drop_null(table.column(field.name)).to_numpy()  # nulls: nothing to lose
        # Every integer up to 2**53 is a double exactly; above, only some are (2**62 is, 2**62 + 1 is not).
        big = [int(v) for v in values[np.abs(values.astype(np.float64)) >= 2**53].tolist()]
        lost = [v for v in big if int(float(v)) != v]
        if lost:
            first = table.filter(pc.equal(table.column(field.name), lost[0])).column(key)[0].as_py()
            raise SinkError(
                f"{where}: column {field.name!r} is a floating column in the table, but {len(lost)} integer "
                f"value(s) of this part cannot be stored in it exactly (e.g. {lost[0]} in {key} {first!r}). "
                "Nothing was written: write to a new table, or make the column text or numeric first."
            )


def _strip_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(NUL, "")
    if isinstance(value, list):
        return [_strip_nul(v) for v in value]
    if isinstance(value, dict):
        return {_strip_nul(k): _strip_nul(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_strip_nul(v) for v in value)
    return value


def _has_text(dtype: pa.DataType) -> bool:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return True
    if pa.types.is_dictionary(dtype):
        return _has_text(dtype.value_type)
    return any(_has_text(dtype.field(i).type) for i in range(dtype.num_fields))


def strip_nul(table: pa.Table, key: str) -> tuple[pa.Table, int, Any]:
    """Remove U+0000 from every string of ``table``; return (table, values changed, the key of one changed row)."""
    changed = 0
    first: Any = None
    for index, field in enumerate(table.schema):
        if not _has_text(field.type):
            continue
        column = table.column(index)
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            hit = pc.fill_null(pc.match_substring(column, NUL), False)
            if not pc.any(hit).as_py():
                continue
            fixed = pc.replace_substring(column, NUL, "")
        else:  # strings inside lists, structs or maps, and dictionary-encoded text: value by value
            values = column.to_pylist()
            cleaned = [_strip_nul(v) for v in values]
            hit = pa.array([a != b for a, b in zip(values, cleaned)], pa.bool_())
            if not pc.any(hit).as_py():
                continue
            fixed = pa.array(cleaned, type=field.type)
        changed += int(pc.sum(pc.cast(hit, pa.int64())).as_py() or 0)
        if first is None:
            first = table.column(key).filter(hit)[0].as_py()
        table = table.set_column(index, field, fixed)
    return table, changed, first
