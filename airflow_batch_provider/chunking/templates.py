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
escaped once and only the column values are escaped per batch, with :func:`json_escape`.

Row problems (nulls in a referenced column, blank prompts, rows whose every template value is
blank) are collected across the whole table in a :class:`RowProblems` so the error can give the
first row numbers and the total count. A blank value is fine as long as another template column
of the row has text: ``""`` is how a table says "no description", so only a row that would send
nothing but the template's own text is refused.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from airflow_batch_provider.exceptions import InvalidInputError

MAX_ROWS_NAMED = 20


def _casts_exactly(arrow_type: pa.DataType) -> bool:
    """Return True when Arrow's cast to string equals Python's ``str`` of every value."""
    return (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
        or pa.types.is_integer(arrow_type)
        or (pa.types.is_dictionary(arrow_type) and _casts_exactly(arrow_type.value_type))
    )


def to_string_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Return ``values`` as a string array whose entries equal ``str(value)``; nulls stay null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type):
        return values
    if _casts_exactly(values.type):
        return pc.cast(values, pa.string())
    return pa.array([None if v is None else str(v) for v in values.to_pylist()], type=pa.string())


def concat(*parts: pa.Array | str) -> pa.Array:
    """Return the row-wise concatenation of string arrays and literal strings as ``large_string``.

    ``large_string`` because a batch of long documents can exceed the 2 GiB that 32-bit offsets
    address. A row with a null in any part is null.
    """
    pieces = [pa.scalar(p, pa.large_string()) if isinstance(p, str) else p.cast(pa.large_string()) for p in parts]
    return pc.binary_join_element_wise(*pieces, pa.scalar("", pa.large_string()), null_handling="emit_null")


# The ASCII bytes orjson escapes (control characters, '"' and '\\'), each with its escape sequence.
_JSON_ESCAPES = {c: orjson.dumps(chr(c))[1:-1] for c in range(128) if orjson.dumps(chr(c)) != b'"%c"' % c}
_JSON_GROWTH = np.zeros(256, dtype=np.int64)  # bytes an escape adds
for _byte, _escape in _JSON_ESCAPES.items():
    _JSON_GROWTH[_byte] = len(_escape) - 1


def json_escape(values: pa.Array) -> pa.Array:
    """Return each string escaped for a JSON string literal (no quotes), byte for byte as orjson does it.

    Vectorised: numpy finds the bytes to escape in the array's data buffer, ``bytes.replace``
    rewrites it once per kind of escape present, and the offsets grow by the bytes each row
    gained. UTF-8 continuation bytes are all >= 0x80, so no multi-byte character is touched.
    Nulls come back as empty strings.
    """
    values = values.cast(pa.large_string())
    if values.null_count:
        values = pc.fill_null(values, "")
    count = len(values)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset : values.offset + count + 1]
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer if data_buffer is not None else b"", dtype=np.uint8)[offsets[0] : offsets[-1]]
    special = np.flatnonzero((data < 0x20) | (data == 0x22) | (data == 0x5C))
    if not special.size:
        return values
    codes = data[special]
    escaped = data.tobytes()
    for code in sorted(np.unique(codes).tolist(), key=lambda c: c != 0x5C):  # backslash first: the others add one
        escaped = escaped.replace(bytes([code]), _JSON_ESCAPES[code])
    grown = np.concatenate(([0], np.cumsum(_JSON_GROWTH[codes])))  # grown[k]: bytes added by the first k escapes
    start = offsets - offsets[0]
    new_offsets = start + grown[np.searchsorted(special, start)]
    return pa.LargeStringArray.from_buffers(count, pa.py_buffer(new_offsets), pa.py_buffer(escaped))


def json_strings(values: pa.Array) -> pa.Array:
    """Return each string as a JSON string literal, byte for byte what ``orjson.dumps`` writes."""
    return concat('"', json_escape(values), '"')


def _is_blank(texts: pa.Array) -> pa.Array:
    """Return, per string, whether it is empty or only whitespace (null stays null)."""
    return pc.or_(pc.equal(pc.binary_length(texts), 0), pc.utf8_is_space(texts))


def _is_text(arrow_type: pa.DataType) -> bool:
    """Return True for the types whose values can be blank text (``str()`` of any other value never is)."""
    if pa.types.is_dictionary(arrow_type):
        return _is_text(arrow_type.value_type)
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type)


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


@dataclass
class RowProblems:
    """Collect bad rows by kind while streaming; raise one InvalidInputError naming them at the end."""

    limit: int = MAX_ROWS_NAMED
    _rows: dict[str, list[int]] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)
    _advice: dict[str, str] = field(default_factory=dict)
    _details: dict[str, list[str]] = field(default_factory=dict)

    def add(
        self, kind: str, positions: Iterable[int] | np.ndarray, advice: str = "", details: Sequence[str] = ()
    ) -> None:
        """Record table positions (0-based) that have problem ``kind`` (e.g. "null in column 'title'").

        ``details`` are extra lines shown under the kind (at most ``limit`` are kept).
        """
        if isinstance(positions, np.ndarray):
            count = int(positions.size)
            head = [int(p) for p in positions[: self.limit]]
        else:
            items = list(positions)
            count, head = len(items), [int(p) for p in items[: self.limit]]
        if not count:
            return
        kept = self._rows.setdefault(kind, [])
        kept.extend(head[: self.limit - len(kept)])
        self._counts[kind] = self._counts.get(kind, 0) + count
        if advice:
            self._advice[kind] = advice
        if details:
            kept_details = self._details.setdefault(kind, [])
            kept_details.extend(details[: self.limit - len(kept_details)])

    def __bool__(self) -> bool:
        return bool(self._counts)

    @property
    def rows(self) -> list[int]:
        """Return the named row positions of every kind, sorted."""
        return sorted({r for rows in self._rows.values() for r in rows})

    def message(self) -> str:
        """Return one paragraph per problem kind, naming rows and the total count."""
        parts = []
        for kind, count in self._counts.items():
            shown = ", ".join(str(r) for r in self._rows[kind])
            more = f" (first {len(self._rows[kind])} shown)" if count > len(self._rows[kind]) else ""
            advice = f" {self._advice[kind]}" if kind in self._advice else ""
            parts.append(f"{kind}: {count:,} row(s) at position {shown}{more}.{advice}")
            parts.extend(f"  - {line}" for line in self._details.get(kind, ()))
        return "\n".join(parts)

    def raise_if_any(self, what: str = "The input table") -> None:
        """Raise InvalidInputError listing every recorded problem, if there is one."""
        if self:
            raise InvalidInputError(
                f"{what} has rows that cannot be turned into requests (positions are 0-based):\n{self.message()}",
                rows=self.rows,
            )


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
                raise InvalidInputError(
                    f"prompt_template field {{{name}:{spec}}} has a nested field in its format spec."
                )
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

    def render_batch(
        self, batch: pa.RecordBatch, *, offset: int = 0, problems: RowProblems | None = None, fast: bool | None = None
    ) -> list[str]:
        """Return one prompt per row of ``batch`` as Python strings (see :meth:`render_array`)."""
        texts: list[str] = self.render_array(batch, offset=offset, problems=problems, fast=fast).to_pylist()
        return texts

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
        null_mask: pa.Array | None = None
        for name in self.fields:
            column = batch.column(name)
            if column.null_count:
                is_null = pc.is_null(column)
                found.add(
                    f"null in column {name!r}",
                    np.asarray(pc.indices_nonzero(is_null)) + offset,
                    advice=f"Fill or filter the rows where {name!r} is null.",
                )
                null_mask = is_null if null_mask is None else pc.or_(null_mask, is_null)
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
            blank = _is_blank(rendered)
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
        return not literals or bool(pc.all(_is_blank(pa.array(literals, pa.string()))).as_py())

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
            if not _is_text(column.type):
                return None  # numbers, dates... never render as blank text
            column_blank = _is_blank(columns[name] if columns is not None else to_string_array(column))
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

    def render_row(self, row: Mapping[str, Any]) -> str:
        """Return the prompt of one row given as a mapping (``str.format_map`` semantics)."""
        return self.template.format_map(row)
