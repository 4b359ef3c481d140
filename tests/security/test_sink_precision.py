"""Issue 25: an int64 of 2**62 + 1 written into a float column of the SQL sink lost digits silently.

Against SQLite and a real PostgreSQL (the sink suite's ``backend`` fixture): such a part is refused
before any row is written, naming the column, the value and its row.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_batch_provider.sinks.sql import SinkError
from tests.test_sql_sink import Backend, backend, merged_part, pg_database  # noqa: F401 (fixtures)

pytestmark = pytest.mark.security


def test_an_int64_that_a_float_column_cannot_hold_is_refused(backend: Backend) -> None:  # noqa: F811
    sink = backend.sink()
    sink.write_part(merged_part(["a"]), 0)  # price: a floating column
    exact = 2**62  # a power of two: a double holds it exactly
    sink.write_part(merged_part(["b"], price=pa.array([exact], pa.int64())), 1)
    with pytest.raises(SinkError, match=r"column 'price' is a floating column .* 2 integer value\(s\)") as info:
        sink.write_part(merged_part(["c", "d", "e"], price=pa.array([2**62 + 1, None, -(2**53) - 1], pa.int64())), 2)
    assert "e.g. 4611686018427387905 in custom_id 'c'" in str(info.value)
    assert [r["custom_id"] for r in backend.rows()] == ["a", "b"]  # nothing of the refused part written
    assert int(backend.rows()[1]["price"]) == exact
