"""Prompt templates: ``str.format`` syntax compiled once, rendered a record batch at a time.

``"Classify this product: {title}\\n{description}"`` names the columns ``title`` and
``description``. Literal braces are written ``{{`` and ``}}`` as in ``str.format``. When no field
carries a format spec or conversion, a whole batch is rendered by pyarrow compute (columns cast
to text, then ``binary_join_element_wise`` of literal pieces and columns); otherwise each row goes
through ``str.format_map``. Both paths give exactly ``template.format(**row)`` for the row's
Python values: only string and integer columns are cast by Arrow (whose text equals ``str()``);
every other type is converted with Python's ``str`` so floats, booleans and dates match too.

Row problems (nulls in a referenced column, blank prompts) are collected across the whole table
in a :class:`RowProblems` so the error can give the first row numbers and the total count.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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
        """Return one prompt per row of ``batch``.

        Rows with a null in a referenced column or a blank prompt are recorded in ``problems``
        (positions are ``offset`` + row index) and come back as ``""``. Without ``problems`` the
        first such batch raises InvalidInputError at once. ``fast`` forces a path (tests).
        """
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
        if use_fast:
            rendered = self._render_fast(batch)
        else:
            rendered, failed, first_error = self._render_rows(batch, null_mask)
            if failed:
                found.add(
                    "prompt_template cannot format the row",
                    np.asarray(failed, dtype=np.int64) + offset,
                    advice=f"First error: {first_error}. Fix the format spec or the column's values.",
                )
        blank = pc.or_(pc.equal(pc.binary_length(rendered), 0), pc.utf8_is_space(rendered))
        if null_mask is not None:
            blank = pc.and_(blank, pc.invert(null_mask))
        blank = pc.fill_null(blank, False)
        if pc.any(blank).as_py():
            found.add(
                "empty or whitespace-only prompt",
                np.asarray(pc.indices_nonzero(blank)) + offset,
                advice="Fill or filter the rows whose template columns are empty.",
            )
        if own:
            found.raise_if_any()
        texts: list[str] = pc.fill_null(rendered, "").to_pylist()
        return texts

    def _render_fast(self, batch: pa.RecordBatch) -> pa.Array:
        columns = {name: to_string_array(batch.column(name)) for name in self.fields}
        parts: list[Any] = []
        for literal, name in self._pieces:
            if literal:
                parts.append(pa.scalar(literal, pa.string()))
            if name is not None:
                parts.append(columns[name])
        return pc.binary_join_element_wise(*parts, "", null_handling="emit_null")

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
