"""Custom ids of a table's rows: from an id column or a hash of the row, checked and de-duplicated.

A backend's ``limits.custom_id_pattern`` says which ids it accepts (Anthropic:
``[a-zA-Z0-9_-]{1,64}``): other user ids are rewritten to a stable ``h-<sha256>``
(:func:`derive_custom_id`; ``h<sha256>`` where the pattern allows no dash). Duplicates are found with 8 bytes a row (see
:func:`report_duplicates`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from airflow_batch_provider.chunking.arrow_text import to_string_array
from airflow_batch_provider.chunking.column_names import CUSTOM_ID
from airflow_batch_provider.chunking.id_hashes import IdHashes
from airflow_batch_provider.chunking.limits import ProviderLimits
from airflow_batch_provider.chunking.problems import RowProblems
from airflow_batch_provider.chunking.tables import TableReader

CONTROL_CHARS = r"[\x00-\x1f\x7f-\x9f]"  # C0, DEL and C1 (RE2 syntax, as Arrow's regex functions take it)
# Whitespace (Unicode separators included: no-break space, ideographic space) and characters that render
# as nothing (format characters such as zero-width space or BOM; Hangul and Braille fillers).
BLANK_ID = r"^[\s\p{Z}\p{Cf}\x{115F}\x{1160}\x{2800}\x{3164}\x{FFA0}]+$"


def derive_custom_id(user_id: str, separator: str = "-") -> str:
    """Return the stable provider-compliant id used for a user id that does not fit the provider's pattern.

    ``h-`` + 40 hex fits Anthropic's ``[a-zA-Z0-9_-]{1,64}``; Bedrock record ids are alphanumeric,
    so there the separator is empty (``h`` + 40 hex).
    """
    return "h" + separator + hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:40]


class IdBuilder:
    """Compute each row's custom_id and record null, NaN, empty, blank, control-character or over-long ids."""

    def __init__(self, limits: ProviderLimits, id_column: str | None, hash_columns: Sequence[str]) -> None:
        self.limits = limits
        self.id_column = id_column
        self.hash_columns = list(hash_columns)
        self.derived = 0
        pattern = limits.custom_id_pattern
        self._regex = None if pattern is None else f"^(?:{pattern.pattern})$"
        # Providers whose ids are alphanumeric only (Bedrock) get derived and hashed ids without a dash.
        self._sep = "-" if pattern is None or pattern.fullmatch("h-0") else ""

    def user_ids(self, batch: pa.RecordBatch) -> pa.Array:
        """Return the id column as text (only with an id_column)."""
        assert self.id_column is not None
        return to_string_array(batch.column(self.id_column))

    def build(self, batch: pa.RecordBatch, *, offset: int, problems: RowProblems) -> pa.Array:
        """Return one custom_id per row (a string array); bad rows get a unique placeholder and are recorded."""
        if self.id_column is None:
            return pa.array(self._hash_ids(batch), pa.string())
        name = self.id_column
        user = self.user_ids(batch)
        bad = pc.fill_null(pc.or_kleene(pc.is_null(user), pc.equal(pc.binary_length(user), 0)), False)
        raw = batch.column(name)
        if pa.types.is_floating(raw.type):  # NaN is a missing value too; as text it would be the id "nan"
            bad = pc.or_(bad, pc.fill_null(pc.is_nan(raw), False))
        problems.add(
            f"null, NaN or empty id in column {name!r}",
            np.asarray(pc.indices_nonzero(bad)) + offset,
            advice="Every row needs an id: fill or filter those rows, or leave id_column unset to hash the rows.",
        )
        # A NUL or other control character: PostgreSQL strips NUL, so "d\x00e" and "de" would become one row.
        control = pc.fill_null(pc.match_substring_regex(user, CONTROL_CHARS), False)
        problems.add(
            f"id with a NUL or other control character in column {name!r}",
            np.asarray(pc.indices_nonzero(control)) + offset,
            advice="Ids are keys in the output table: remove control characters from them (or hash the rows).",
        )
        # An id of only spaces or invisible characters looks empty in the output table and the provider's console.
        blank = pc.fill_null(pc.match_substring_regex(user, BLANK_ID), False)
        problems.add(
            f"id of only whitespace or invisible characters in column {name!r}",
            np.asarray(pc.indices_nonzero(blank)) + offset,
            advice="An id must be visible text (not ' ', a no-break space or a zero-width space): fill those ids, "
            "or leave id_column unset to hash the rows.",
        )
        bad = pc.or_(pc.or_(bad, control), blank)
        bad_rows = np.asarray(pc.indices_nonzero(bad))
        limit = self.limits.max_custom_id_chars
        if limit is not None:
            too_long = pc.fill_null(pc.greater(pc.utf8_length(user), limit), False)
            problems.add(
                f"id longer than {limit} characters in column {name!r}",
                np.asarray(pc.indices_nonzero(too_long)) + offset,
                advice=f"{self.limits.provider} accepts custom ids of at most {limit} characters; shorten them.",
            )
        ids = user
        if self._regex is not None:
            misfit = pc.invert(pc.fill_null(pc.match_substring_regex(user, self._regex), True))
            misfits = np.asarray(pc.indices_nonzero(misfit))
            if misfits.size:
                derived = [derive_custom_id(value, self._sep) for value in user.take(misfits).to_pylist()]
                ids = pc.replace_with_mask(ids, misfit, pa.array(derived, pa.string()))
            self.derived += int(misfits.size)
            if misfits.size and name == CUSTOM_ID:
                problems.add(
                    f"id in column {CUSTOM_ID!r} that {self.limits.provider} does not accept",
                    misfits + offset,
                    advice=f"These ids must be rewritten, which would overwrite the column {CUSTOM_ID!r} in the "
                    "rows file; rename the column and pass the new name as id_column.",
                )
        if bad_rows.size:  # unique placeholders keep these rows out of the duplicate check
            placeholders = [f"\x00{offset + index}" for index in bad_rows.tolist()]
            ids = pc.replace_with_mask(ids, bad, pa.array(placeholders, pa.string()))
        return ids

    def _hash_ids(self, batch: pa.RecordBatch) -> list[str]:
        # Hash the values' text forms so the same data read from csv, jsonl or parquet gets the same ids.
        columns = [to_string_array(batch.column(name)).to_pylist() for name in self.hash_columns]
        dumps, blake2b, prefix = orjson.dumps, hashlib.blake2b, "row" + self._sep
        return [prefix + blake2b(dumps(values), digest_size=8).hexdigest() for values in zip(*columns)]


def id_hashes(custom_ids: pa.Array) -> np.ndarray:
    """Return Python's 64-bit ``hash()`` of every id (see :func:`report_duplicates`)."""
    return np.fromiter(map(hash, custom_ids.to_pylist()), dtype=np.int64, count=len(custom_ids))


def report_duplicates(
    hashes: IdHashes,
    reader: TableReader,
    columns: Sequence[str],
    limits: ProviderLimits,
    id_column: str | None,
    problems: RowProblems,
) -> None:
    """Record rows whose custom_id repeats an earlier row's, naming both positions.

    Memory: instead of a set of every id string (~100 bytes a row, 1 GB at 10M rows) the stream
    keeps one 64-bit ``hash()`` per row, bounded by spilling to disk (:class:`IdHashes`). Only
    when two hashes are equal does a second pass re-read the table to confirm real duplicates and
    find the first positions.
    """
    candidates = hashes.repeated()
    if not candidates:
        return
    ids = IdBuilder(limits, id_column, columns)
    first_seen: dict[str, tuple[int, str | None]] = {}
    later: list[int] = []
    details: list[str] = []
    offset = 0
    for batch in reader.batches(columns):
        custom_ids = ids.build(batch, offset=offset, problems=RowProblems()).to_pylist()
        user = ids.user_ids(batch).to_pylist() if id_column else [None] * batch.num_rows
        for index, custom_id in enumerate(custom_ids):
            if hash(custom_id) not in candidates:
                continue
            position = offset + index
            if custom_id not in first_seen:
                first_seen[custom_id] = (position, user[index])
                continue
            first, first_user = first_seen[custom_id]
            later.append(position)
            if id_column is None:
                details.append(f"rows {first} and {position} are identical (custom_id {custom_id!r})")
            elif first_user == user[index]:
                details.append(f"id {first_user!r} at rows {first} and {position}")
            else:
                details.append(
                    f"ids {first_user!r} (row {first}) and {user[index]!r} (row {position}) "
                    f"both become custom_id {custom_id!r}"
                )
        offset += batch.num_rows
    if id_column is None:
        kind, advice = (
            "duplicate row",
            "Without id_column a row's id is a hash of its values: pass id_column, or drop the repeated rows.",
        )
    else:
        kind, advice = (
            f"duplicate id in column {id_column!r}",
            "Each request needs a unique custom_id: de-duplicate the table or choose another id_column.",
        )
    problems.add(kind, later, advice=advice, details=details)
