"""Issue 25's table findings, each run the way it was found: ChunkOperator then SubmitBatchOperator.

- a source column ``Status`` (any case of a result column) passed the check, was billed, then the
  merge failed (``duplicate column name: status`` in SQLite);
- ids ``d\\x00e`` and ``de`` were both billed; PostgreSQL strips NUL, so two answers became one row;
- a NaN in a float column the prompt uses was sent as ``Classify: nan``.

Issue 38 (item 9), the same way: names that only look different from a result column (``"response "``,
a zero-width space, full-width letters, the sink's own ``nul_escaped``) and ids that look empty (a
no-break space, a zero-width space) were billed; a NUL in a column name failed the PostgreSQL merge.

The ``emulator`` fixture of the chunking suite asserts nothing was uploaded.
"""

from __future__ import annotations

import re

import pytest

from airflow_batch_provider.exceptions import InvalidInputError
from tests.chunking.test_bad_input import _chunk_then_submit, _parquet, emulator  # noqa: F401 (a fixture)

pytestmark = pytest.mark.security


@pytest.mark.parametrize("column", ["Status", "STATUS", "Response", "Custom_ID", "Request_Fingerprint"])
def test_a_result_column_name_in_any_case_is_refused_before_upload(emulator, tmp_path, column):  # noqa: F811
    source = _parquet(tmp_path / "p.parquet", id=["a", "b"], title=["x", "y"], **{column: ["1", "2"]})
    with pytest.raises(InvalidInputError, match=repr(column)):
        _chunk_then_submit(source, tmp_path / "job")


def test_columns_differing_only_in_case_are_refused(emulator, tmp_path):  # noqa: F811
    source = _parquet(tmp_path / "p.parquet", id=["a"], title=["x"], Title=["y"])
    with pytest.raises(InvalidInputError, match=r"\['Title', 'title'\] that differ only in case"):
        _chunk_then_submit(source, tmp_path / "job")


def test_ids_with_nul_or_control_characters_are_refused_naming_the_rows(emulator, tmp_path):  # noqa: F811
    ids = ["d\x00e", "de", "tab\there", "ok", "bell\x07", "c1\x85"]
    source = _parquet(tmp_path / "p.parquet", id=ids, title=["t"] * len(ids))
    with pytest.raises(InvalidInputError) as info:
        _chunk_then_submit(source, tmp_path / "job")
    message = str(info.value)
    assert "id with a NUL or other control character in column 'id': 4 row(s) at position 0, 2, 4, 5" in message


def test_nan_in_a_prompt_column_is_refused_like_none(emulator, tmp_path):  # noqa: F811
    nan = float("nan")
    source = _parquet(tmp_path / "p.parquet", id=["a", "b", "c"], title=[1.5, nan, None])
    with pytest.raises(InvalidInputError) as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "NaN in column 'title': 1 row(s) at position 1" in str(info.value)
    assert "null in column 'title': 1 row(s) at position 2" in str(info.value)


@pytest.mark.parametrize(
    "column",
    [
        "response ",
        " status",
        "Response\u200b",
        "\ufeffstatus",
        "\uff52\uff45\uff53\uff50\uff4f\uff4e\uff53\uff45",
        "nul_escaped",
    ],
    ids=["trailing-space", "leading-space", "zero-width-space", "bom", "full-width", "sink-marker"],
)
def test_a_name_disguised_as_a_result_column_is_refused_before_upload(emulator, tmp_path, column):  # noqa: F811
    source = _parquet(tmp_path / "p.parquet", id=["a", "b"], title=["x", "y"], **{column: ["1", "2"]})
    with pytest.raises(InvalidInputError, match=f"column\\(s\\) \\[{re.escape(repr(column))}\\] named like the result"):
        _chunk_then_submit(source, tmp_path / "job")


def test_a_nul_in_a_column_name_is_refused_before_upload(emulator, tmp_path):  # noqa: F811
    source = _parquet(tmp_path / "p.parquet", id=["a"], title=["x"], **{"note\x00; DROP TABLE results": ["1"]})
    with pytest.raises(InvalidInputError, match="holding a NUL or other control character"):
        _chunk_then_submit(source, tmp_path / "job")


def test_ids_that_look_empty_are_refused_naming_the_rows(emulator, tmp_path):  # noqa: F811
    ids = ["ok", " ", "\u00a0", "\u200b", "\u3000\u2060", "x\u200by", "\u3164"]
    source = _parquet(tmp_path / "p.parquet", id=ids, title=["t"] * len(ids))
    with pytest.raises(InvalidInputError) as info:
        _chunk_then_submit(source, tmp_path / "job")
    message = str(info.value)
    assert (
        "id of only whitespace or invisible characters in column 'id': 5 row(s) at position 1, 2, 3, 4, 6." in message
    )
    assert "fill those ids, or leave id_column unset" in message
