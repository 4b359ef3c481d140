"""Prompt template compilation, batch rendering (fast and per-row paths) and row problems."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest

from airflow_batch_provider.chunking.arrow_text import json_escape, json_strings, to_string_array
from airflow_batch_provider.chunking.problems import RowProblems
from airflow_batch_provider.chunking.templates import PromptTemplate
from airflow_batch_provider.exceptions import InvalidInputError


def render_batch(template: PromptTemplate, batch: pa.RecordBatch, **options: Any) -> list[str]:
    """Return one prompt per row as Python strings (the text path, :meth:`PromptTemplate.render_array`)."""
    texts: list[str] = template.render_array(batch, **options).to_pylist()
    return texts


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("Hello {}", "positional field", id="auto-positional"),
        pytest.param("Hello {0}", "positional field", id="indexed-positional"),
        pytest.param("Hello {row.title}", "attribute or index access", id="attribute"),
        pytest.param("Hello {row[0]}", "attribute or index access", id="index"),
        pytest.param("Hello {title", "not a valid str.format template", id="unclosed"),
        pytest.param("Hello } there {title}", "not a valid str.format template", id="single-close"),
        pytest.param("No fields {{here}}", "references no column", id="no-fields"),
        pytest.param("{title:{width}}", "nested field", id="nested-spec"),
    ],
)
def test_bad_templates_are_rejected(template: str, expected: str) -> None:
    with pytest.raises(InvalidInputError, match=expected):
        PromptTemplate(template)


def test_fields_escapes_and_paths() -> None:
    template = PromptTemplate("{{literal}} {title} / {description} / {title}")
    assert template.fields == ("title", "description")
    assert template.fast_path
    batch = pa.record_batch({"title": ["T"], "description": ["D"]})
    assert render_batch(template, batch) == ["{literal} T / D / T"]
    assert not PromptTemplate("{price:.2f}").fast_path
    assert not PromptTemplate("{name!r}").fast_path


def test_missing_columns_are_named_with_the_available_ones() -> None:
    template = PromptTemplate("{title} {desc} {brand}")
    with pytest.raises(InvalidInputError) as info:
        template.check_columns(["title", "description", "sku"])
    message = str(info.value)
    assert "['desc', 'brand']" in message
    assert "['title', 'description', 'sku']" in message


def _typed_batch() -> pa.RecordBatch:
    return pa.record_batch(
        {
            "s": pa.array(["a", 'quote " é', "line\nbreak", "😀 中文", "  padded  "]),
            "ls": pa.array(["x", "y", "z", "w", "v"], pa.large_string()),
            "dict": pa.array(["red", "blue", "red", "green", "blue"]).dictionary_encode(),
            "i": pa.array([0, -5, 2**40, 7, 1], pa.int64()),
            "u8": pa.array([0, 1, 2, 3, 255], pa.uint8()),
            "f": pa.array([1.0, 1.5, 1e20, 0.1 + 0.2, -0.0]),
            "f32": pa.array([1.0, 0.5, 3.25, 2.0, 100.0], pa.float32()),
            "b": pa.array([True, False, True, False, True]),
            "d": pa.array([dt.date(2024, 1, 2)] * 5),
            "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)] * 5),
            "dec": pa.array([Decimal("1.10"), Decimal("2"), Decimal("-3.5"), Decimal("0"), Decimal("9.99")]),
            "lst": pa.array([[1, 2], [], [3], [4, 5], [6]]),
        }
    )


def test_fast_path_equals_per_row_path_equals_str_format() -> None:
    batch = _typed_batch()
    template = PromptTemplate(" | ".join(f"{name}={{{name}}}" for name in batch.schema.names))
    fast = render_batch(template, batch, fast=True)
    slow = render_batch(template, batch, fast=False)
    expected = [template.template.format(**row) for row in batch.to_pylist()]
    assert fast == slow == expected


def test_to_string_array_matches_str() -> None:
    batch = _typed_batch()
    for name in batch.schema.names:
        values = batch.column(name).to_pylist()
        assert to_string_array(batch.column(name)).to_pylist() == [str(v) for v in values], name


def test_format_specs_use_the_per_row_path() -> None:
    batch = pa.record_batch({"price": [1.5, 2.0], "name": ["a", "b"]})
    template = PromptTemplate("{name!r} costs {price:.2f}")
    assert render_batch(template, batch) == ["'a' costs 1.50", "'b' costs 2.00"]


def test_format_errors_name_the_rows() -> None:
    batch = pa.record_batch({"price": ["cheap", "dear"]})
    with pytest.raises(InvalidInputError) as info:
        render_batch(PromptTemplate("{price:.2f}"), batch, offset=100)
    assert "cannot format" in str(info.value)
    assert "100, 101" in str(info.value)
    assert "ValueError" in str(info.value)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "per-row"])
def test_nulls_and_blank_prompts_are_named(fast: bool) -> None:
    batch = pa.record_batch(
        {
            "title": ["ok", None, "  ", "", "fine", None],
            "note": ["", "", " \n\t", "", "", "x"],
        }
    )
    template = PromptTemplate("{title}{note}")
    problems = RowProblems()
    texts = render_batch(template, batch, offset=10, problems=problems, fast=fast)
    assert len(texts) == 6
    assert texts[0] == "ok" and texts[4] == "fine"
    message = problems.message()
    assert "null in column 'title': 2 row(s) at position 11, 15." in message
    assert "Fill or filter the rows where 'title' is null." in message
    assert "empty or whitespace-only prompt: 2 row(s) at position 12, 13." in message
    assert problems.rows == [11, 12, 13, 15]
    with pytest.raises(InvalidInputError) as info:
        render_batch(template, batch, fast=fast)
    assert info.value.rows == [1, 2, 3, 5]


def test_row_problems_name_the_first_20_and_count_all() -> None:
    problems = RowProblems()
    problems.add("null in column 'a'", np.arange(15))
    problems.add("null in column 'a'", np.arange(1000, 1030))
    problems.add("other", [])
    assert "other" not in problems.message()
    message = problems.message()
    assert "45 row(s)" in message
    assert "(first 20 shown)" in message
    assert "1004" in message and "1005" not in message
    with pytest.raises(InvalidInputError) as info:
        problems.raise_if_any("Table t")
    assert str(info.value).startswith("Table t has rows")
    assert len(info.value.rows) == 20


ESCAPE_CASES = [
    "",
    "plain ascii",
    'quote " backslash \\ slash /',
    "\\n is not a newline, \\\\ is two backslashes",
    "newline\ncarriage\rtab\tbackspace\bformfeed\f",
    "rare controls \x00 \x01 \x07 \x0b \x0e \x1b \x1f and DEL \x7f",
    "unicode é ñ 中文 😀 \u2028 \u2029 \ufeff",
    "".join(chr(c) for c in range(128)),
    "x" * 5_000 + '"' + "y" * 5_000,
]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(pa.array(ESCAPE_CASES), id="string"),
        pytest.param(pa.array(ESCAPE_CASES, pa.large_string()), id="large-string"),
        pytest.param(pa.array(["skip", *ESCAPE_CASES, "skip"]).slice(1, len(ESCAPE_CASES)), id="sliced"),
        pytest.param(pa.array(["no", "escapes", "here"]), id="nothing-to-escape"),
        pytest.param(pa.array([], pa.string()), id="empty"),
    ],
)
def test_json_strings_match_orjson_byte_for_byte(values: pa.Array) -> None:
    expected = [orjson.dumps(text).decode() for text in values.to_pylist()]
    assert json_strings(values).to_pylist() == expected
    assert json_escape(values).to_pylist() == [text[1:-1] for text in expected]


def test_json_escape_turns_nulls_into_empty_strings() -> None:
    assert json_escape(pa.array(["a\n", None, '"'])).to_pylist() == ["a\\n", "", '\\"']


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "per-row"])
def test_render_json_is_orjson_of_render_array(fast: bool) -> None:
    batch = pa.record_batch({"title": ESCAPE_CASES[1:], "n": list(range(len(ESCAPE_CASES) - 1))})
    template = PromptTemplate('Say "{title}"\n#{n}\t{title}')
    texts = template.render_array(batch, fast=fast).to_pylist()
    assert template.render_json(batch, fast=fast).to_pylist() == [orjson.dumps(t).decode() for t in texts]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "per-row"])
def test_render_json_appends_the_suffix_to_every_row_nulls_included(fast: bool) -> None:
    batch = pa.record_batch({"title": ["kettle", None, 'say "hi"']})
    suffix = '}],"max_tokens":5}}'
    rendered = PromptTemplate("Tag: {title}").render_json(batch, problems=RowProblems(), fast=fast, suffix=suffix)
    assert rendered.to_pylist() == ['"Tag: kettle"' + suffix, '""' + suffix, '"Tag: say \\"hi\\""' + suffix]


@pytest.mark.parametrize(
    "template",
    ["{title}{note}", "  {title}\n{note}\t", "Classify: {title} {note}"],
    ids=["only-fields", "blank-literals", "text-literal"],
)
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "per-row"])
def test_render_json_records_the_same_problems_as_render_array(template: str, fast: bool) -> None:
    """The JSON path decides blank prompts from the pieces; it must agree with rendering them."""
    batch = pa.record_batch(
        {"title": ["ok", None, "  ", "", "\u3000", None, "x"], "note": ["", "", " \n\t", "", "", "x", "\u2003"]}
    )
    prompt = PromptTemplate(template)
    as_text, as_json = RowProblems(), RowProblems()
    texts = prompt.render_array(batch, offset=5, problems=as_text, fast=fast).to_pylist()
    rendered = prompt.render_json(batch, offset=5, problems=as_json, fast=fast).to_pylist()
    assert as_json.message() == as_text.message()
    assert as_json.rows == as_text.rows
    nulls = {1, 5}
    assert [r for i, r in enumerate(rendered) if i in nulls] == ['""', '""']
    assert [r for i, r in enumerate(rendered) if i not in nulls] == [
        orjson.dumps(t).decode() for i, t in enumerate(texts) if i not in nulls
    ]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "per-row"])
def test_rows_whose_every_value_is_blank_are_named(fast: bool) -> None:
    """A template with text of its own is never blank, but a row with no text of its own is refused."""
    batch = pa.record_batch(
        {"title": ["ok", "  ", "", None, "\u3000", "", "x"], "note": ["", "\n", "", "", "note", "\t", ""]}
    )
    problems = RowProblems()
    PromptTemplate("Classify: {title}\n{note}").render_json(batch, offset=10, problems=problems, fast=fast)
    message = problems.message()
    assert (
        "empty or whitespace-only value in every template column ['title', 'note']: 3 row(s) at position 11, 12, 15."
        in message
    )
    assert "Fill or filter those rows" in message and "null in column 'title'" in message
    assert problems.rows == [11, 12, 13, 15]  # row 13 is named for its null only
    assert "empty or whitespace-only prompt" not in message


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "per-row"])
def test_one_column_template_names_the_column_with_the_blank_value(fast: bool) -> None:
    batch = pa.record_batch({"title": pa.array(["kettle", " ", "lamp"]).dictionary_encode()})
    with pytest.raises(InvalidInputError, match="empty or whitespace-only value in column 'title': 1 row\\(s\\) at"):
        render_batch(PromptTemplate("Classify this product: {title}"), batch, fast=fast)


def test_a_column_that_is_not_text_is_never_blank() -> None:
    batch = pa.record_batch({"title": ["", " "], "price": [0, 1], "when": [dt.date(2024, 1, 1)] * 2})
    assert render_batch(PromptTemplate("{title}: {price}"), batch) == [": 0", " : 1"]
    assert render_batch(PromptTemplate("{title!s:>4} on {when}"), batch) == ["     on 2024-01-01"] * 2


def test_a_blank_prompt_is_not_also_reported_as_blank_values() -> None:
    batch = pa.record_batch({"title": ["ok", " ", ""]})
    problems = RowProblems()
    render_batch(PromptTemplate("{title!s:>2}"), batch, problems=problems)
    assert problems.message().count("row(s)") == 1
    assert "empty or whitespace-only prompt: 2 row(s) at position 1, 2." in problems.message()
