"""The checks in airflow_batch_provider.validation: text that is not UTF-8."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.templates import RowProblems
from airflow_batch_provider.validation import check_utf8


def _invalid_text(values: list[bytes], *, large: bool = False) -> pa.Array:
    """Return ``values`` as a string array without validating them (as the parquet and jsonl readers do)."""
    raw = pa.array(values, pa.large_binary() if large else pa.binary())
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(values), raw.buffers())


@pytest.mark.parametrize(
    "column",
    [
        _invalid_text([b"ok", b"caf\xe9", b"ok", b"\xff"]),
        _invalid_text([b"ok", b"caf\xe9", b"ok", b"\xff"], large=True),
        pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, 1]), _invalid_text([b"ok", b"caf\xe9"])),
        pa.ListArray.from_arrays(pa.array([0, 1, 2, 3, 4]), _invalid_text([b"ok", b"caf\xe9", b"ok", b"\xff"])),
    ],
    ids=["string", "large-string", "dictionary", "list"],
)
def test_text_that_is_not_utf8_names_the_rows(column: pa.Array) -> None:
    batch = pa.record_batch({"id": [1, 2, 3, 4], "title": column})
    problems = RowProblems()
    with pytest.raises(InvalidInputError) as info:
        check_utf8(batch, offset=100, problems=problems, what="The table t.jsonl")
    assert "invalid UTF-8 text in column 'title': 2 row(s) at position 101, 103." in str(info.value)
    assert info.value.rows == [101, 103]


def test_valid_text_passes_the_utf8_check() -> None:
    batch = pa.record_batch({"id": [1, 2], "title": ["café", "中文 😀"], "tags": [["a"], []]})
    check_utf8(batch, offset=0, problems=RowProblems(), what="The table")
