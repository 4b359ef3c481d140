"""Bad input fails in the chunk step, names the rows and what to do, and nothing reaches the provider.

Every case runs ChunkOperator and, if it ever returned, SubmitBatchOperator on each chunk — so a
case the chunk step let through would show up as an upload in the emulator's stats. The cases
next to them that must keep working run the chunk step only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.exceptions import ChunkLimitError, InvalidInputError
from airflow_batch_provider.operators.chunk import ChunkOperator
from airflow_batch_provider.operators.submit import SubmitBatchOperator
from tests.support import InMemoryTaskStateStore, make_context

PROMPT = "Classify this product: {title}"


def _parquet(path: Path, **columns: list[Any]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def _chunk_only(source: Path, job_dir: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """Run the chunk step alone (for input that must go through, nothing is uploaded)."""
    args: dict[str, Any] = {
        "task_id": "chunk",
        "source": str(source),
        "prompt_template": PROMPT,
        "model": "gpt-4o-mini",
        "id_column": "id",
        "job_dir": str(job_dir),
        "canary_rows": 0,  # input checks only: the canary has its tests in tests/batches/test_canary.py
        **kwargs,
    }
    return list(ChunkOperator(**args).execute(make_context()))


def _chunk_then_submit(source: Path, job_dir: Path, **kwargs: Any) -> list[dict[str, Any]]:
    """Run the chunk step and submit whatever it produced (nothing, when it rejects the input)."""
    return [
        SubmitBatchOperator(task_id="submit", chunk=chunk).execute(make_context(InMemoryTaskStateStore()))
        for chunk in _chunk_only(source, job_dir, **kwargs)
    ]


@pytest.fixture
def emulator(openai_conn, anthropic_conn):
    yield openai_conn
    stats = openai_conn.stats()
    assert stats["openai"]["files_uploaded"] == 0, "bad input reached the provider"
    assert stats["openai"]["batches_created"] == 0 and stats["anthropic"]["batches_created"] == 0


def _no_chunks_left(job_dir: Path) -> None:
    assert not (job_dir / "chunks").exists(), sorted(p.name for p in job_dir.rglob("*"))


def test_corrupt_parquet(emulator, tmp_path):
    source = tmp_path / "products.parquet"
    source.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(InvalidInputError, match=r"Cannot read .*products\.parquet as parquet") as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "corrupted or this is not a parquet file" in str(info.value)
    _no_chunks_left(tmp_path / "job")


def test_truncated_jsonl_names_the_row(emulator, tmp_path):
    source = tmp_path / "products.jsonl"
    source.write_text('{"id": 1, "title": "kettle"}\n{"id": 2, "title": "lamp"')
    with pytest.raises(InvalidInputError, match=r"products.jsonl as jsonl.*row 1"):
        _chunk_then_submit(source, tmp_path / "job")
    _no_chunks_left(tmp_path / "job")


READ_ERRORS = [
    pytest.param("p.csv", b"", "The file is empty: write a header row", id="empty-csv"),
    pytest.param("p.jsonl", b"", "The file is empty: write one JSON object per line", id="empty-jsonl"),
    pytest.param(
        "p.csv",
        b'id,title,note\n1,"two\nlines",a\n2,lamp\n3,kettle,c\n',
        "Line 4 has 2 field(s) where the header has 3: quote values that contain the delimiter",
        id="ragged-csv-after-a-multi-line-value",
    ),
    pytest.param(
        "p.jsonl",
        b'{"id": 1, "title": "a"}\n{"id": 2, "title": "b"}\n{"id": 3, "title": \n{"id": 4, "title": "d"}\n',
        "Line 3 is not one complete JSON object",
        id="malformed-jsonl-line",
    ),
]


@pytest.mark.parametrize(("name", "content", "hint"), READ_ERRORS)
def test_read_errors_get_a_hint_that_fits_them(emulator, tmp_path, name, content, hint):
    """Not "column types are inferred from the first block", which is wrong for all of these."""
    source = tmp_path / name
    source.write_bytes(content)
    with pytest.raises(InvalidInputError, match=f"Cannot read .*{name}") as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert hint in str(info.value)
    assert "inferred from the first block" not in str(info.value)
    _no_chunks_left(tmp_path / "job")


def test_a_csv_value_of_another_type_after_the_first_block_says_types_are_inferred(emulator, tmp_path):
    source = tmp_path / "p.csv"
    lines = [f"{i},title {i},{i}" for i in range(600_000)]  # more than the reader's first 8 MB block
    source.write_text("id,title,price\n" + "\n".join(lines) + "\n1000000,late,cheap\n")
    with pytest.raises(InvalidInputError, match="inferred from the first block of the file") as info:
        _chunk_only(source, tmp_path / "job")
    assert "parquet" in str(info.value) and "'cheap'" in str(info.value)


def test_missing_input_file(emulator, tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        _chunk_then_submit(tmp_path / "nowhere.parquet", tmp_path / "job")


def test_missing_template_column_lists_what_there_is(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=[1, 2], name=["kettle", "lamp"])
    with pytest.raises(InvalidInputError, match=r"\['title'\].*available columns: \['id', 'name'\]"):
        _chunk_then_submit(source, tmp_path / "job")


def test_null_prompt_value_names_the_row(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=[1, 2, 3], title=["kettle", None, "lamp"])
    with pytest.raises(InvalidInputError, match="null in column 'title': 1 row\\(s\\) at position 1") as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "Fill or filter" in str(info.value) and info.value.rows == [1]
    _no_chunks_left(tmp_path / "job")


def test_blank_prompt_names_the_rows(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=[1, 2, 3], title=["kettle", "  ", ""])
    with pytest.raises(InvalidInputError, match="whitespace-only prompt: 2 row\\(s\\) at position 1, 2") as info:
        _chunk_then_submit(source, tmp_path / "job", prompt_template="{title}")
    assert "Fill or filter" in str(info.value)


def test_blank_value_inside_a_template_names_the_row(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=[1, 2], title=["kettle", "  "])
    with pytest.raises(
        InvalidInputError, match="whitespace-only value in column 'title': 1 row\\(s\\) at position 1"
    ) as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "Fill or filter" in str(info.value) and info.value.rows == [1]
    _no_chunks_left(tmp_path / "job")


def test_a_blank_value_next_to_text_is_fine(emulator, tmp_path):
    """Only a row whose every template value is blank is refused: "" is how a table says "no description"."""
    source = _parquet(tmp_path / "p.parquet", id=[1, 2], title=["kettle", "lamp"], note=["", "  "])
    chunks = _chunk_only(source, tmp_path / "job", prompt_template="Classify this product: {title}\n{note}")
    assert [chunk["num_requests"] for chunk in chunks] == [2]


def test_non_utf8_csv(emulator, tmp_path):
    source = tmp_path / "p.csv"
    source.write_bytes("id,title\n1,kettle\n2,caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(InvalidInputError, match=r"p\.csv as csv.*invalid UTF8"):
        _chunk_then_submit(source, tmp_path / "job")


def test_non_utf8_jsonl_names_the_row(emulator, tmp_path):
    source = tmp_path / "p.jsonl"
    source.write_bytes('{"id": 1, "title": "kettle"}\n{"id": 2, "title": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(
        InvalidInputError, match="invalid UTF-8 text in column 'title': 1 row\\(s\\) at position 1"
    ) as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "re-encode it as UTF-8" in str(info.value) and info.value.rows == [1]
    _no_chunks_left(tmp_path / "job")


def test_non_utf8_parquet_names_the_row(emulator, tmp_path):
    """The parquet reader does not validate UTF-8 either (a file written by another tool can hold any bytes)."""
    raw = pa.array([b"kettle", b"lamp", b"caf\xe9"], pa.binary())
    titles = pa.StringArray.from_buffers(3, raw.buffers()[1], raw.buffers()[2])
    source = _parquet(tmp_path / "p.parquet", id=[1, 2, 3], title=titles)
    with pytest.raises(InvalidInputError, match="invalid UTF-8 text in column 'title': 1 row\\(s\\) at position 2"):
        _chunk_then_submit(source, tmp_path / "job")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('id,title\n1,"kettle\n2,lamp\n', "p.csv line 2: a quoted value opens here and is never closed"),
        (
            'id,title\n1,"kettle\n2,lamp\n3,"cup"\n',
            "p.csv line 2: a quoted value opens here and is closed only on line 4",
        ),
    ],
    ids=["runs-to-the-end", "closes-in-a-later-value"],
)
def test_unterminated_csv_quote_is_not_silently_merged(emulator, tmp_path, text, message):
    source = tmp_path / "p.csv"
    source.write_text(text)
    with pytest.raises(InvalidInputError, match=message) as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert 'write a quote inside a value as ""' in str(info.value)
    _no_chunks_left(tmp_path / "job")


def test_multi_line_and_lenient_csv_quotes_still_read(emulator, tmp_path):
    source = tmp_path / "p.csv"
    source.write_text('id,title\n1,"two\nlines"\n2,"say ""hi"""\n3,15" screen\n4,"Big" kettle\n')
    chunks = _chunk_only(source, tmp_path / "job", prompt_template="{title}")
    assert [chunk["num_requests"] for chunk in chunks] == [4]
    lines = (tmp_path / "job" / "chunks" / "chunk-00000.jsonl").read_text().splitlines()
    texts = [orjson.loads(line)["body"]["messages"][0]["content"] for line in lines]
    assert texts == ["two\nlines", 'say "hi"', '15" screen', "Big kettle"]


def test_duplicate_ids_name_both_rows(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=[1, 2, 2, 3], title=["a", "b", "c", "d"])
    with pytest.raises(InvalidInputError, match="duplicate id in column 'id'") as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "id '2' at rows 1 and 2" in str(info.value) and "de-duplicate" in str(info.value)


def test_null_and_empty_ids_name_the_rows(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=["a", None, "", "d"], title=["w", "x", "y", "z"])
    with pytest.raises(InvalidInputError, match="null, NaN or empty id in column 'id': 2 row\\(s\\) at position 1, 2"):
        _chunk_then_submit(source, tmp_path / "job")


def test_nan_ids_are_refused_like_nulls_naming_the_rows(emulator, tmp_path):
    """A float id column with NaN would be sent as custom_id 'nan' (two NaNs: a 'duplicate')."""
    nan = float("nan")
    source = _parquet(tmp_path / "p.parquet", id=[1.0, nan, 3.0, nan], title=["w", "x", "y", "z"])
    with pytest.raises(InvalidInputError, match="null, NaN or empty id in column 'id': 2 row\\(s\\) at position 1, 3"):
        _chunk_then_submit(source, tmp_path / "job")
    assert emulator.stats()["openai"]["files_uploaded"] == 0
    _no_chunks_left(tmp_path / "job")


@pytest.mark.parametrize("column", ["status", "response", "error", "finish_reason", "batch_id", "attempts"])
def test_a_source_column_named_like_a_result_column_is_refused_before_upload(emulator, tmp_path, column):
    """Otherwise the batch is billed and the merge fails on every retry."""
    source = _parquet(tmp_path / "p.parquet", id=["a", "b"], title=["w", "x"], **{column: ["1", "2"]})
    with pytest.raises(
        InvalidInputError, match=f"column\\(s\\) \\[{column!r}\\] named like the result columns"
    ) as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert f"'source_{column}'" in str(info.value) and "columns=" in str(info.value)
    _no_chunks_left(tmp_path / "job")


def test_a_result_named_column_left_out_with_columns_is_fine(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=["a", "b"], title=["w", "x"], status=["on", "off"])
    (chunk,) = _chunk_only(source, tmp_path / "job", columns=["title"])
    assert "status" not in pq.read_schema(chunk["rows_path"]).names


def test_a_request_over_the_byte_cap_names_the_row(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=[1, 2, 3], title=["a", "x" * 5000, "c"])
    with pytest.raises(ChunkLimitError, match="Row 1 \\(custom_id '2'\\)") as info:
        _chunk_then_submit(source, tmp_path / "job", byte_cap=2000)
    assert "raise byte_cap" in str(info.value)
    _no_chunks_left(tmp_path / "job")


@pytest.mark.parametrize(
    ("provider", "endpoint", "model"),
    [("openai", "/v1/messages", "gpt-4o-mini"), ("anthropic", "/v1/embeddings", "claude-haiku-5-5")],
    ids=["openai-messages", "anthropic-embeddings"],
)
def test_an_endpoint_the_provider_does_not_have(emulator, tmp_path, provider, endpoint, model):
    source = _parquet(tmp_path / "p.parquet", id=[1], title=["a"])
    with pytest.raises(InvalidInputError, match=f"Endpoint '{endpoint}' is not supported .* accepted: "):
        _chunk_then_submit(source, tmp_path / "job", provider=provider, endpoint=endpoint, model=model)


@pytest.mark.parametrize(
    ("endpoint", "model", "message"),
    [
        ("/v1/chat/completions", "text-embedding-3-small", "is an embedding model .* Use endpoint='/v1/embeddings'"),
        ("/v1/embeddings", "gpt-4o-mini", "is a chat model and cannot serve /v1/embeddings. Use an embedding model"),
    ],
    ids=["embedding-model-on-chat", "chat-model-on-embeddings"],
)
def test_a_model_that_cannot_serve_the_endpoint(emulator, tmp_path, endpoint, model, message):
    source = _parquet(tmp_path / "p.parquet", id=[1], title=["a"])
    with pytest.raises(InvalidInputError, match=f"Model '{model}' {message}"):
        _chunk_then_submit(source, tmp_path / "job", endpoint=endpoint, model=model)
    assert not (tmp_path / "job").exists()


# -- what the merge's sink could not store, refused before anything is paid for (issue 38, item 9) --------------

LONG_NAME = "description_" + "x" * 52  # 64 bytes; PostgreSQL keeps 63


@pytest.mark.parametrize(
    ("name", "message"),
    [
        pytest.param(LONG_NAME, f"column named '{LONG_NAME}' of 64 bytes .* keeps only the first 63", id="64-bytes"),
        pytest.param("prix_" + "é" * 30, "of 65 bytes \\(UTF-8\\)", id="64-chars-65-bytes"),
        pytest.param("ti\x00tle", "holding a NUL or other control character", id="nul"),
        pytest.param("", "empty, or only whitespace or invisible characters", id="empty"),
        pytest.param("\u00a0\u200b", "empty, or only whitespace or invisible characters", id="invisible"),
    ],
)
def test_a_column_name_no_sink_can_hold_is_refused_before_upload(emulator, tmp_path, name, message):
    """Before: billed, then the PostgreSQL merge failed (``already exists`` / ``unterminated quoted identifier``)."""
    source = _parquet(tmp_path / "p.parquet", id=["a", "b"], title=["w", "x"], **{name: ["1", "2"]})
    with pytest.raises(InvalidInputError, match=message) as info:
        _chunk_then_submit(source, tmp_path / "job")
    assert "Rename the column in the source, or leave it out with columns=" in str(info.value)
    _no_chunks_left(tmp_path / "job")


def test_a_63_byte_column_name_and_a_long_one_left_out_are_fine(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=["a"], title=["w"], **{LONG_NAME[:63]: ["1"], LONG_NAME: ["2"]})
    (chunk,) = _chunk_only(source, tmp_path / "job", columns=[LONG_NAME[:63]])
    assert LONG_NAME[:63] in pq.read_schema(chunk["rows_path"]).names


def test_columns_differing_only_in_surrounding_whitespace_are_refused(emulator, tmp_path):
    source = _parquet(tmp_path / "p.parquet", id=["a"], title=["w"], **{"title ": ["x"]})
    with pytest.raises(InvalidInputError, match=r"\['title', 'title '\] that differ only in case, surrounding"):
        _chunk_then_submit(source, tmp_path / "job")
    _no_chunks_left(tmp_path / "job")


def test_inf_in_a_prompt_column_is_refused_like_nan(emulator, tmp_path):
    """Before: sent as ``Classify this product: inf``."""
    inf = float("inf")
    source = _parquet(tmp_path / "p.parquet", id=["a", "b", "c", "d"], title=[1.5, inf, 2.0, -inf])
    with pytest.raises(InvalidInputError) as info:
        _chunk_then_submit(source, tmp_path / "job")
    message = str(info.value)
    assert "inf or -inf in column 'title': 2 row(s) at position 1, 3." in message
    assert "Fill or filter the rows where 'title' is inf or -inf." in message
    _no_chunks_left(tmp_path / "job")


def test_a_row_over_the_context_window_names_the_row_its_tokens_and_the_window(emulator, tmp_path):
    """Claude's tokens are counted as 3.5 characters each (as the cost estimate does): 665,000 → 190,000."""
    text = "a" * 665_000
    source = _parquet(tmp_path / "p.parquet", id=["a", "b", "c"], title=["short", text, "short"])
    template = {"prompt_template": "{title}", "provider": "anthropic", "model": "claude-haiku-4-5"}
    # 190,000 tokens and 5 to answer fit the 200,000-token window ...
    (chunk,) = _chunk_only(source, tmp_path / "ok", request_params={"max_tokens": 5}, **template)
    assert chunk["num_requests"] == 3
    # ... with 20,000 to answer they do not.
    with pytest.raises(InvalidInputError) as info:
        _chunk_then_submit(source, tmp_path / "job", request_params={"max_tokens": 20_000}, **template)
    message = str(info.value)
    assert (
        "request longer than the 200,000-token context window of claude-haiku-4-5: 1 row(s) at position 1." in message
    )
    assert re.search(r"row 1 \(custom_id 'b'\): about 190,0\d\d input tokens \+ max_tokens 20,000", message), message
    assert "lower max_tokens" in message and "approximation chars/3.5" in message
    _no_chunks_left(tmp_path / "job")
