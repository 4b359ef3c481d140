"""Structured output: validate each row's JSON answer against the job's schema at merge time.

The chunk step saves the schema next to the chunks (``chunks/schema.json``, see
:mod:`airflow_batch_provider.chunking.staging`) and names it in every chunk descriptor. The
merge step parses each succeeded answer, validates it, and writes the top-level fields as
columns. A row whose answer is not valid JSON or does not match the schema gets
``status = "invalid_output"`` and the reason in ``error`` — one bad answer never fails the merge.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pyarrow as pa

from airflow_batch_provider.utils.storage import to_path

#: Distinct answer texts whose verdict :meth:`OutputValidator.parse` remembers, and the longest
#: text it remembers: short answers (labels, scores) repeat; long ones rarely do, and 20,000 answers
#: of 100 KB would hold 2 GB. Together they bound the memo to ~10 MB per chunk.
MEMO_SIZE = 20_000
MEMO_MAX_CHARS = 512

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "number": pa.float64(),
    "integer": pa.int64(),
    "boolean": pa.bool_(),
}


def _column_type(prop: dict[str, Any]) -> pa.DataType:
    kind = prop.get("type")
    if isinstance(kind, list):  # e.g. ["string", "null"]
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return _ARROW_TYPES.get(kind or "", pa.string())  # objects, arrays, unions: kept as JSON text


class OutputValidator:
    """Parse and validate answers against one JSON Schema; say which columns they become."""

    def __init__(self, schema: dict[str, Any], reserved: set[str] | frozenset[str] = frozenset()) -> None:
        self.schema = schema
        cls = jsonschema.validators.validator_for(schema)
        self._validator = cls(schema)
        self._memo: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
        props: dict[str, Any] = schema.get("properties") or {}
        # Field names that clash with a source or result column get an "output_" prefix.
        self.columns: dict[str, tuple[str, pa.DataType]] = {
            field: (f"output_{field}" if field in reserved else field, _column_type(spec))
            for field, spec in props.items()
        }

    @classmethod
    def from_file(cls, path: str, reserved: set[str] | frozenset[str] = frozenset()) -> OutputValidator:
        """Load the schema saved by the chunk step."""
        return cls(orjson.loads(to_path(path).read_bytes()), reserved)

    def parse(self, answer: Any) -> tuple[dict[str, Any] | None, str | None]:
        """Return (column values, None) for a valid answer, or (None, reason) for an invalid one.

        The same answer text gets the same verdict: a classifier's answers repeat (a few labels, a
        confidence with two decimals), so each distinct text is validated once, up to
        :data:`MEMO_SIZE` texts of up to :data:`MEMO_MAX_CHARS` characters — validating is most of
        what merging structured output costs.
        The values dict is shared between rows with the same answer: callers only read it.
        """
        if not isinstance(answer, str) or len(answer) > MEMO_MAX_CHARS:
            return self._parse(answer)
        verdict = self._memo.get(answer)
        if verdict is None:
            verdict = self._parse(answer)
            if len(self._memo) < MEMO_SIZE:
                self._memo[answer] = verdict
        return verdict

    def _parse(self, answer: Any) -> tuple[dict[str, Any] | None, str | None]:
        if not isinstance(answer, str) or not answer.strip():
            return None, "the answer is empty; expected a JSON object"
        try:
            obj = orjson.loads(answer)
        except orjson.JSONDecodeError as exc:
            return None, f"the answer is not valid JSON ({exc}): {answer[:120]!r}"
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(obj))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return None, f"the answer does not match the schema at {where}: {error.message}"
        values: dict[str, Any] = {}
        for field, (column, dtype) in self.columns.items():
            value = obj.get(field)
            if value is not None and dtype == pa.string() and not isinstance(value, str):
                value = orjson.dumps(value).decode()
            values[column] = value
        return values, None
