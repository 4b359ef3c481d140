"""The checks in airflow_batch_provider.chunking.validation: csv quotes that would merge rows, text that is not UTF-8."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from airflow_batch_provider.chunking import tables
from airflow_batch_provider.chunking.problems import RowProblems
from airflow_batch_provider.chunking.tables import TableReader
from airflow_batch_provider.chunking.validation import check_csv_quotes, check_utf8
from airflow_batch_provider.exceptions import InvalidInputError

BLOCK_SIZES = (1, 2, 3, 7, 1 << 20)


def _scan(data: bytes, block_size: int) -> str | None:
    """Return the error check_csv_quotes raises for ``data`` read in blocks of ``block_size`` (None: fine)."""
    try:
        check_csv_quotes((data[i : i + block_size] for i in range(0, len(data), block_size)), "p.csv")
    except InvalidInputError as err:
        return str(err)
    return None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"id,title\n1,kettle\n",
        b'id,title\n1,"line one\nline two"\n2,lamp\n',
        b'id,title\r\n1,"line one\r\nline two"\r\n2,lamp\r\n',
        b'id,title\r1,"a\rb"\r2,z\r',
        b'id,title\n1,"say ""hi""\nthere"\n2,"a,b"\n3,""\n4,""""\n',
        b'"id","title"\n"1","x"',
        b'\xef\xbb\xbf"id","title"\n1,"a\nb"\n',
        b'id,title\n1,15" screen\n2,"multi\nline"\n3,x\n',  # the reader's leniency on one line stays
        b'id,title\n1,"Big" kettle\n2,"multi\nline"\n',
        b'id,title\n1,a""b\n2,"c\nd"\n',
    ],
)
def test_correct_and_lenient_quoting_passes(data: bytes) -> None:
    for size in BLOCK_SIZES:
        assert _scan(data, size) is None, size


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'id,title\n1,"kettle\n2,lamp\n', "line 2: a quoted value opens here and is never closed"),
        (b'id,title\n1,"kettle\n2,lamp', "line 2: a quoted value opens here and is never closed"),
        (b'id,title\n1,"kettle', "line 2: a quoted value opens here and is never closed"),
        (
            b'id,title\n1,"kettle\n2,lamp\n3,"cup"\n4,x\n',
            "line 2: a quoted value opens here and is closed only on line 4",
        ),
        (
            b'id,title\n1,15" screen\n2,"lamp\n3,"cup"\n',
            "line 3: a quoted value opens here and is closed only on line 4",
        ),
        (b'id,title\n1,"a\nb"x\n', "line 2: a quoted value opens here and is closed only on line 3"),
        (b'id,title\n1,"a""\n2,b\n', "line 2: a quoted value opens here and is never closed"),
    ],
)
def test_quotes_that_would_merge_rows_name_the_line(data: bytes, expected: str) -> None:
    for size in BLOCK_SIZES:
        assert _scan(data, size) == _reference(data), size
        assert f"p.csv {expected}" in str(_scan(data, size))


def _reference(data: bytes) -> str | None:
    """The rule of check_csv_quotes byte by byte, as plainly as it can be written (slow)."""
    text = data.decode()
    in_quote, field_start, line, breaks, open_line, open_breaks = False, True, 1, 0, 0, 0
    i = 0
    while i < len(text):
        char = text[i]
        if in_quote and char == '"':
            if text[i + 1 : i + 2] == '"':
                i += 2
                continue
            in_quote = False
            if breaks > open_breaks and text[i + 1 : i + 2] not in ("", ",", "\n", "\r"):
                return (
                    f"p.csv line {open_line}: a quoted value opens here and is closed only on line {line}, by a "
                    "quote followed by more text, so the csv reader would read the rows in between into that one "
                    f"value. Most likely the quote on line {open_line} is not closed: close it, or write a quote "
                    'inside a value as "".'
                )
        elif not in_quote and char == '"' and field_start:
            in_quote, open_line, open_breaks = True, line, breaks
        if not in_quote:
            field_start = char in ",\r\n"
        breaks += char in "\r\n"
        line += char == "\n"
        i += 1
    if in_quote:
        return (
            f"p.csv line {open_line}: a quoted value opens here and is never closed, so the csv reader would read "
            'every row after it into that one value. Close the quote, or write a quote inside a value as "".'
        )
    return None


def test_random_files_get_the_reference_answer_whatever_the_blocks() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        data = ("x,y\n" + "".join(rng.choice('ab,""\n\r') for _ in range(rng.randint(0, 30)))).encode()
        expected = _reference(data)
        for size in (1, 2, 5, 1 << 20):
            assert _scan(data, size) == expected, (data, size)


def test_files_pyarrow_writes_pass() -> None:
    rng = random.Random(3)
    for _ in range(200):
        values = ["".join(rng.choice('ab ,"\n\r') for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(1, 6))]
        sink = pa.BufferOutputStream()
        pacsv.write_csv(pa.table({"x": values, "y": list(range(len(values)))}), sink)
        data = sink.getvalue().to_pybytes()
        assert _scan(data, 3) is None and _scan(data, 1 << 20) is None, data


def test_the_reader_checks_every_csv_file_before_parsing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "_TEXT_BLOCK_BYTES", 64)  # many blocks, for the reader and the check
    good = "".join(f'{i},"line {i}\nsecond ""line"""\n' for i in range(50))
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv.gz").write_bytes(gzip.compress(("id,title\n" + good).encode()))
    (folder / "b.csv").write_text("id,title\n" + good + '50,"unclosed\n51,x\n')
    reader = TableReader(folder, string_columns=["id", "title"])
    with pytest.raises(InvalidInputError, match=r"b\.csv line 102: a quoted value opens here and is never closed"):
        for _ in reader.batches():
            pass
    (folder / "b.csv").write_text("id,title\n" + good)
    rows = sum(batch.num_rows for batch in TableReader(folder, string_columns=["id", "title"]).batches())
    assert rows == 100


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
