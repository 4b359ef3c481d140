"""Which source column names can reach the merged output, checked before anything is uploaded.

The kept source columns become columns of every merged part and of the SQL sink's table next to
the columns the chunk step and the merge add (``custom_id``, ``request_fingerprint``,
:data:`~airflow_batch_provider.descriptors.RESULT_COLUMNS` and the sink's own
:data:`~airflow_batch_provider.sinks.sql_types.NUL_ESCAPED_COLUMN`). The chunk step cannot know
whether the merge will write to a sink (that is the merge task's argument, and may be added on a
later run), so it holds every name to what the strictest sink accepts. A name found bad only at the
merge would already be billed; here renaming it costs nothing. Refused:

- an empty name, or one of only whitespace or invisible characters;
- a NUL or other control character (PostgreSQL reads a NUL as the end of the name:
  ``unterminated quoted identifier``);
- more than :data:`MAX_NAME_BYTES` bytes of UTF-8 (PostgreSQL cuts names there, so two long names
  become one, ``already exists``, and a long one no longer matches its own column);
- two names, or a name and an added column, that differ only in case, surrounding whitespace,
  Unicode compatibility forms or invisible characters (``"Response"``, ``"response "``,
  ``"response\\u200b"``): SQL sinks fold case (SQLite; PostgreSQL for unquoted reads) and a reader
  of the table cannot tell them apart.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from airflow_batch_provider.descriptors import RESULT_COLUMNS
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.sinks.sql_types import NUL_ESCAPED_COLUMN

CUSTOM_ID = "custom_id"
FINGERPRINT = "request_fingerprint"
MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Characters that render as nothing (format characters, fillers, variation selectors): a name
# holding them looks like the name without them.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0]"
)


def normal_name(name: str) -> str:
    """Return ``name`` as a reader compares it: without invisible characters, NFKC, stripped, case-folded."""
    return unicodedata.normalize("NFKC", _INVISIBLE.sub("", name)).strip().casefold()


def check_output_names(names: Sequence[str], id_column: str | None) -> None:
    """Raise InvalidInputError unless every kept source column in ``names`` can be a merged output column."""
    _check_each(names)
    normal = [normal_name(n) for n in names]
    clashing = sorted({n for n, key in zip(names, normal) if normal.count(key) > 1})
    if clashing:
        raise InvalidInputError(
            f"The table has columns {clashing} that differ only in case, surrounding whitespace or invisible "
            "characters, which SQL sinks and readers of the output cannot tell apart; rename them."
        )
    by_normal = dict(zip(normal, names))
    if FINGERPRINT in by_normal:
        raise InvalidInputError(
            f"The table has a column named {by_normal[FINGERPRINT]!r}, which the rows file adds as {FINGERPRINT!r}; "
            "rename it."
        )
    added = [*RESULT_COLUMNS, NUL_ESCAPED_COLUMN]
    taken = [n for n, key in zip(names, normal) if key in {normal_name(c) for c in added}]
    if taken:
        raise InvalidInputError(
            f"The table has column(s) {taken} named like the result columns the merge adds "
            f"({', '.join(added)}). Rename them in the source (e.g. {taken[0]!r} → 'source_{taken[0].strip()}'), "
            "or leave them out with columns= if the prompt does not use them."
        )
    custom = by_normal.get(CUSTOM_ID)
    if custom is not None and not (custom == CUSTOM_ID == id_column):
        raise InvalidInputError(
            f"The table has a column named {custom!r} that the rows file's {CUSTOM_ID!r} would clash with; "
            f"pass id_column={CUSTOM_ID!r} if it is exactly that, else rename it, or leave it out with columns=."
        )


def _check_each(names: Sequence[str]) -> None:
    """Refuse blank names, names with control characters and names over MAX_NAME_BYTES bytes."""
    advice = "Rename the column in the source, or leave it out with columns= if the prompt does not use it."
    for name in names:
        if not normal_name(name):
            raise InvalidInputError(
                f"The table has a column named {name!r}: empty, or only whitespace or invisible characters. {advice}"
            )
        if _CONTROL.search(name):
            raise InvalidInputError(
                f"The table has a column named {name!r} holding a NUL or other control character, which SQL sinks "
                f"cannot store in a column name. {advice}"
            )
        size = len(name.encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise InvalidInputError(
                f"The table has a column named {name!r} of {size} bytes (UTF-8); PostgreSQL keeps only the first "
                f"{MAX_NAME_BYTES} bytes of a name, so the merge could not write it. {advice}"
            )
