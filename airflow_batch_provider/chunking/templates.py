"""Prompt templates: ``str.format`` syntax compiled once, rendered a record batch at a time.

``"Classify this product: {title}\\n{description}"`` names the columns ``title`` and
``description``. Literal braces are written ``{{`` and ``}}`` as in ``str.format``. When no field
carries a format spec or conversion, a whole batch is rendered by pyarrow compute (columns cast
to text, then ``binary_join_element_wise`` of literal pieces and columns); otherwise each row goes
through ``str.format_map``. Both paths give exactly ``template.format(**row)`` for the row's
Python values: only string and integer columns are cast by Arrow (whose text equals ``str()``);
every other type is converted with Python's ``str`` so floats, booleans and dates match too.

:meth:`PromptTemplate.render_json` gives each prompt as a JSON string literal (what
``orjson.dumps(prompt)`` writes) for the request lines: on the fast path the literal pieces are
escaped once and only the column values are escaped per batch, with
:func:`~airflow_batch_provider.chunking.arrow_text.json_escape`.

Row problems (nulls in a referenced column, blank prompts, rows whose every template value is
blank) are collected across the whole table in a
:class:`~airflow_batch_provider.chunking.problems.RowProblems` so the error can give the
first row numbers and the total count. A blank value is fine as long as another template column
of the row has text: ``""`` is how a table says "no description", so only a row that would send
nothing but the template's own text is refused.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from airflow_batch_provider.chunking.arrow_text import concat, is_blank, is_text, json_escape, to_string_array
from airflow_batch_provider.chunking.problems import RowProblems
from airflow_batch_provider.exceptions import InvalidInputError

_BLANK_ADVICE = "Fill or filter the rows whose template columns are empty."
_BLANK_VALUES_ADVICE = (
    "Fill or filter those rows: their prompt would be only the template's own text, the same for each of them."
)


def _add_rows(
    found: RowProblems, rows: pa.Array | None, null_mask: pa.Array | None, offset: int, *, kind: str, advice: str
) -> None:
    """Record the rows set in the boolean array ``rows`` (None: none) as ``kind``, except rows with a null."""
    if rows is None:
        return
    if null_mask is not None:
        rows = pc.and_(rows, pc.invert(null_mask))
    rows = pc.fill_null(rows, False)
    if pc.any(rows).as_py():
        found.add(kind, np.asarray(pc.indices_nonzero(rows)) + offset, advice=advice)


def _check_field(name: str, spec: str | None) -> None:
    """Raise InvalidInputError unless ``{name:spec}`` is a plain column field this module can render."""
    if name == "" or name.isdigit():
        raise InvalidInputError(
            f"prompt_template uses a positional field {{{name}}}; name a column instead, e.g. {{title}}."
        )
    if "." in name or "[" in name:
        raise InvalidInputError(
            f"prompt_template field {{{name}}} uses attribute or index access; "
            "only plain column names are supported — add a column with the value you need."
        )
    if spec and "{" in spec:
        raise InvalidInputError(f"prompt_template field {{{name}:{spec}}} has a nested field in its format spec.")


class PromptTemplate:
    """A compiled ``str.format`` prompt template over table columns."""

    def __init__(self, template: str) -> None:
        if not isinstance(template, str):
            raise InvalidInputError(f"prompt_template must be a string, got {type(template).__name__}.")
        self.template = template
        self._pieces: list[tuple[str, str | None]] = []  # (literal, column or None)
        fields: list[str] = []
        fast = True
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as err:
            raise InvalidInputError(
                f"prompt_template is not a valid str.format template ({err}); write literal braces as {{{{ and }}}}."
            ) from None
        for literal, name, spec, conversion in parsed:
            if name is None:
                self._pieces.append((literal, None))
                continue
            _check_field(name, spec)
            if spec or conversion:
                fast = False
            self._pieces.append((literal, name))
            if name not in fields:
                fields.append(name)
        if not fields:
            raise InvalidInputError(
                "prompt_template references no column, so every request would be the same; "
                "name at least one column in braces, e.g. 'Summarise: {text}'."
            )
        self.fields: tuple[str, ...] = tuple(fields)
        self.fast_path = fast

    def __repr__(self) -> str:
        return f"PromptTemplate({self.template!r})"

    def check_columns(self, available: Sequence[str]) -> None:
        """Raise InvalidInputError naming referenced columns that ``available`` lacks."""
        missing = [name for name in self.fields if name not in available]
        if missing:
            raise InvalidInputError(
                f"prompt_template references column(s) {missing} that the table does not have; "
                f"available columns: {list(available)}."
            )

    def render_array(
        self, batch: pa.RecordBatch, *, offset: int = 0, problems: RowProblems | None = None, fast: bool | None = None
    ) -> pa.Array:
        """Return one prompt per row of ``batch`` as an Arrow string array without nulls.

        Rows with a null in a referenced column or a blank prompt are recorded in ``problems``
        (positions are ``offset`` + row index) and come back as ``""``. Without ``problems`` the
        first such batch raises InvalidInputError at once. ``fast`` forces a path (tests).
        """
        return self._render(batch, offset, problems, fast, as_json=False)

    def render_json(
        self,
        batch: pa.RecordBatch,
        *,
        offset: int = 0,
        problems: RowProblems | None = None,
        fast: bool | None = None,
        suffix: str = "",
    ) -> pa.Array:
        """Return one prompt per row as a JSON string literal, byte for byte ``orjson.dumps(prompt)``.

        Validates exactly like :meth:`render_array`; a row with a null comes back as ``'""'``.
        ``suffix`` is appended to every row in the same pass (the rest of a request body, say).
        """
        return self._render(batch, offset, problems, fast, as_json=True, suffix=suffix)

    def _render(
        self,
        batch: pa.RecordBatch,
        offset: int,
        problems: RowProblems | None,
        fast: bool | None,
        as_json: bool,
        suffix: str = "",
    ) -> pa.Array:
        own = problems is None
        found = RowProblems() if problems is None else problems
        null_mask = _missing_values(batch, self.fields, offset, found)
        use_fast = self.fast_path if fast is None else fast
        if use_fast and not self.fast_path:
            raise ValueError("this template needs the per-row path (it has format specs or conversions)")
        blank_values: pa.Array | None  # rows whose every template value is blank (None: no row)
        if use_fast:
            columns = {name: to_string_array(batch.column(name)) for name in self.fields}
            # A prompt is blank exactly when every piece is: with blank literals, blank values make a blank prompt.
            values_blank = self._blank_values(batch, columns)
            blank, blank_values = (values_blank, None) if self._blank_literals else (None, values_blank)
            rendered = self._join_json(columns, suffix) if as_json else self._join(columns)
        else:
            rendered, failed, first_error = self._render_rows(batch, null_mask)
            if failed:
                found.add(
                    "prompt_template cannot format the row",
                    np.asarray(failed, dtype=np.int64) + offset,
                    advice=f"First error: {first_error}. Fix the format spec or the column's values.",
                )
            blank = is_blank(rendered)
            blank_values = self._blank_values(batch)
            if blank_values is not None:  # a blank prompt is reported as such, not twice
                blank_values = pc.and_kleene(blank_values, pc.invert(pc.fill_null(blank, False)))
            if as_json:
                rendered = concat('"', json_escape(pc.fill_null(rendered, "")), '"' + suffix)
        _add_rows(found, blank, null_mask, offset, kind="empty or whitespace-only prompt", advice=_BLANK_ADVICE)
        _add_rows(found, blank_values, null_mask, offset, kind=self._blank_values_kind, advice=_BLANK_VALUES_ADVICE)
        if own:
            found.raise_if_any()
        if as_json and null_mask is not None:  # json_escape turned nulls into "": mark those rows the same way
            return pc.if_else(null_mask, pa.scalar('""' + suffix, pa.large_string()), rendered)
        return pc.fill_null(rendered, "") if rendered.null_count else rendered

    @cached_property
    def _blank_literals(self) -> bool:
        """Return True when every literal piece is whitespace (lazily: DAG parsing builds no arrays)."""
        literals = [literal for literal, _ in self._pieces if literal]
        return not literals or bool(pc.all(is_blank(pa.array(literals, pa.string()))).as_py())

    @cached_property
    def _blank_values_kind(self) -> str:
        if len(self.fields) == 1:
            return f"empty or whitespace-only value in column {self.fields[0]!r}"
        return f"empty or whitespace-only value in every template column {list(self.fields)}"

    def _blank_values(self, batch: pa.RecordBatch, columns: Mapping[str, pa.Array] | None = None) -> pa.Array | None:
        """Return which rows have an empty or whitespace-only value in every template column.

        None when no row of the batch has (the usual case: the first column with text in every
        row ends the check). ``columns`` are the fields as text when already computed. Nulls
        stay null.
        """
        blank: pa.Array | None = None
        for name in self.fields:
            column = batch.column(name)
            if not is_text(column.type):
                return None  # numbers, dates... never render as blank text
            column_blank = is_blank(columns[name] if columns is not None else to_string_array(column))
            blank = column_blank if blank is None else pc.and_(blank, column_blank)
            if not pc.any(blank).as_py():
                return None
        return blank

    def _join(self, columns: Mapping[str, pa.Array]) -> pa.Array:
        parts: list[pa.Array | str] = []
        for literal, name in self._pieces:
            if literal:
                parts.append(literal)
            if name is not None:
                parts.append(columns[name])
        return concat(*parts)

    def _join_json(self, columns: Mapping[str, pa.Array], suffix: str = "") -> pa.Array:
        # Literal pieces are escaped once here, merged with the quotes that open and close the string.
        parts: list[pa.Array | str] = []
        pending = '"'
        for literal, name in self._pieces:
            pending += orjson.dumps(literal).decode()[1:-1]
            if name is not None:
                if pending:
                    parts.append(pending)
                parts.append(json_escape(columns[name]))
                pending = ""
        return concat(*parts, pending + '"' + suffix)

    def _render_rows(self, batch: pa.RecordBatch, null_mask: pa.Array | None) -> tuple[pa.Array, list[int], str]:
        """Render row by row; return the prompts, the rows format_map rejected and the first error."""
        columns = [batch.column(name).to_pylist() for name in self.fields]
        skip = [False] * batch.num_rows if null_mask is None else null_mask.to_pylist()
        template, fields = self.template, self.fields
        out: list[str | None] = []
        failed: list[int] = []
        first_error = ""
        for index, (values, is_null) in enumerate(zip(zip(*columns), skip)):
            if is_null:
                out.append(None)
                continue
            try:
                out.append(template.format_map(dict(zip(fields, values))))
            except (ValueError, TypeError, KeyError) as err:
                out.append(None)
                failed.append(index)
                first_error = first_error or f"{type(err).__name__}: {err}"
        return pa.array(out, type=pa.string()), failed, first_error


def _missing_values(batch: pa.RecordBatch, fields: Iterable[str], offset: int, found: RowProblems) -> pa.Array | None:
    """Record the rows with a null, NaN or ±inf (as text "nan", "inf") in a referenced column; return their mask."""
    mask: pa.Array | None = None
    for name in fields:
        column = batch.column(name)
        checks = []
        if column.null_count:
            checks.append(("null", pc.is_null(column)))
        if pa.types.is_floating(column.type):
            checks.append(("NaN", pc.fill_null(pc.is_nan(column), False)))
            # Not a number either: it would be sent as the text "inf" or "-inf".
            checks.append(("inf or -inf", pc.fill_null(pc.is_inf(column), False)))
        for what, rows in checks:
            found.add(
                f"{what} in column {name!r}",
                np.asarray(pc.indices_nonzero(rows)) + offset,
                advice=f"Fill or filter the rows where {name!r} is {what}.",
            )
            mask = rows if mask is None else pc.or_(mask, rows)
    return mask
