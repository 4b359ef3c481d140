"""Column types of SqlUpsertSink: Arrow → SQL (the table in :mod:`airflow_batch_provider.sinks.sql`), the
check that a part still fits an existing table, and the rule for NUL characters on PostgreSQL.

**Type changes are refused.** Columns are typed from the first part written. A later part whose column
would need another kind of SQL column (text → array, number → text, ...) fails with SinkError before
any row is written: writing on would store ``'{0.1,…}'`` text in a TEXT column (a job switched from chat
to embeddings) or fail row by row. Widening an integer into an existing floating or numeric column is
allowed while every value converts exactly (an int64 over 2**53 would silently lose digits in a double
column: such a part is refused, naming the row); so is an all-null column of any type.

**NUL characters on PostgreSQL.** PostgreSQL text (and JSONB) cannot hold U+0000, which a model answer
can contain. Removing it would change the answer silently, and refusing the part would leave a paid answer
unstorable, so the sink escapes it, reversibly and only where needed: each value that holds a NUL (a text
value, or an array or JSON value with such a string, keys included) is written with every backslash
doubled and every NUL as backslash-zero, and its row's :data:`NUL_ESCAPED_COLUMN` names those columns
(comma separated; NULL in every other row, and again NULL when a later write brings the row without a
NUL). :func:`decode_nul` gives the exact value back. The sink adds that column the first time it is
needed and logs how many values it escaped, naming the first custom_id. Values without a NUL are
written as they are. The parquet part keeps the exact answer; SQLite stores NUL as it is.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
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
#: The column of the PostgreSQL sink's table that names the columns it escaped NUL characters in, per row.
NUL_ESCAPED_COLUMN = "nul_escaped"


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


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace(NUL, "\\0")


def _escape_nested(value: Any) -> Any:
    if isinstance(value, str):
        return _escape(value)
    if isinstance(value, list):
        return [_escape_nested(v) for v in value]
    if isinstance(value, dict):
        return {_escape_nested(k): _escape_nested(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_escape_nested(v) for v in value)
    return value


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    return False


_ESCAPED = re.compile(r"\\([\\0])")


def decode_nul(value: str) -> str:
    """Return the exact text of a value the PostgreSQL sink escaped (a column named in its row's ``nul_escaped``)."""
    return _ESCAPED.sub(lambda m: NUL if m.group(1) == "0" else "\\", value)


def _has_text(dtype: pa.DataType) -> bool:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return True
    if pa.types.is_dictionary(dtype):
        return _has_text(dtype.value_type)
    return any(_has_text(dtype.field(i).type) for i in range(dtype.num_fields))


def _escaped_column(column: pa.ChunkedArray, dtype: pa.DataType) -> tuple[pa.Array | None, pa.Array]:
    """Return (the column with the values that hold a NUL escaped, or None when none does; which rows)."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        hit = pc.fill_null(pc.match_substring(column, NUL), False)
        if not pc.any(hit).as_py():
            return None, hit
        escaped = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), NUL, "\\0")
        return pc.if_else(hit, escaped, column), hit
    values = column.to_pylist()  # strings inside lists, structs or maps, dictionary-encoded text
    hit = pa.array([_holds_nul(v) for v in values], pa.bool_())
    if not pc.any(hit).as_py():
        return None, hit
    return pa.array([_escape_nested(v) if _holds_nul(v) else v for v in values], type=dtype), hit


def escape_nul(table: pa.Table, key: str) -> tuple[pa.Table, int, Any]:
    """Escape U+0000 in ``table`` by the module's rule; return (table, values escaped, the key of one such row).

    Adds :data:`NUL_ESCAPED_COLUMN` only when some value held a NUL.
    """
    marks: dict[int, list[str]] = {}
    for index, field in enumerate(table.schema):
        if not _has_text(field.type):
            continue
        escaped, hit = _escaped_column(table.column(index), field.type)
        if escaped is None:
            continue
        for row in np.flatnonzero(np.asarray(hit)).tolist():
            marks.setdefault(row, []).append(field.name)
        table = table.set_column(index, field, escaped)
    if not marks:
        return table, 0, None
    first = table.column(key)[min(marks)].as_py()
    names = [",".join(marks[row]) if row in marks else None for row in range(table.num_rows)]
    table = table.append_column(pa.field(NUL_ESCAPED_COLUMN, pa.string()), pa.array(names, pa.string()))
    return table, sum(len(m) for m in marks.values()), first
