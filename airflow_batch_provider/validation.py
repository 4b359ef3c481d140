"""Input checks of the chunk step that neither the table readers nor the provider make for us.

- :func:`check_model_endpoint`: a model whose *name* says it cannot serve the endpoint.
- :func:`check_utf8`: text the parquet and jsonl readers pass through without validating.

Each raises :class:`~airflow_batch_provider.exceptions.InvalidInputError` naming the row, line or
model at fault and what to do, before anything is written or uploaded.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_batch_provider.exceptions import InvalidInputError

if TYPE_CHECKING:
    from airflow_batch_provider.templates import RowProblems

# ------------------------------------------------------------------------------ model vs endpoint

_EMBEDDINGS = "/v1/embeddings"
# Names of chat (text-generation) model families that have no embeddings, with an optional
# fine-tune prefix: gpt-4o-mini, chatgpt-4o-latest, o1, o3-mini, o4-mini, claude-haiku-4-5, ft:gpt-4o:...
_CHAT_MODEL = re.compile(r"^(?:ft:)?(?:gpt-|chatgpt-|o\d+(?:-|:|$)|claude-)", re.IGNORECASE)


def check_model_endpoint(model: str, endpoint: str) -> None:
    """Raise InvalidInputError when ``model``'s name says it cannot serve ``endpoint``.

    The rule is deliberately small, so no working setup is refused:

    - a name containing ``embed`` (``text-embedding-3-small``, ``nomic-embed-text``,
      ``Qwen3-Embedding-8B``) is an embedding model: refused on every endpoint but ``/v1/embeddings``;
    - a name of a known chat family (``gpt-*``, ``chatgpt-*``, ``o1``/``o3-*``/``o4-*``,
      ``claude-*``, optionally behind ``ft:``) that does not contain ``embed`` is refused on
      ``/v1/embeddings``.

    Any other name (self-hosted models, fine-tunes, aliases) is accepted on every endpoint.
    """
    is_embedding = "embed" in model.lower()
    if endpoint == _EMBEDDINGS:
        if not is_embedding and _CHAT_MODEL.match(model):
            raise InvalidInputError(
                f"Model {model!r} is a chat model and cannot serve {_EMBEDDINGS}. Use an embedding model "
                "(e.g. 'text-embedding-3-small'), or endpoint='/v1/chat/completions' for chat requests."
            )
    elif is_embedding:
        raise InvalidInputError(
            f"Model {model!r} is an embedding model (its name contains 'embed') and cannot serve {endpoint}. "
            f"Use endpoint={_EMBEDDINGS!r} (provider 'openai') to compute embeddings, or a chat model "
            f"(e.g. 'gpt-4o-mini') for {endpoint}."
        )


# --------------------------------------------------------------------------------------- UTF-8


def check_utf8(batch: pa.RecordBatch, *, offset: int, problems: RowProblems, what: str) -> None:
    """Raise InvalidInputError naming the rows of ``batch`` whose text is not valid UTF-8.

    The parquet and jsonl readers do not validate string data (the csv reader does), and the
    bytes would go into the request file as they are. ``offset`` is the table position of the
    batch's first row. The error lists the problems recorded so far in ``problems`` too, but only
    this batch's invalid rows: later rows are not read. Costs one full validation of the batch
    (about 2 ms per 65,536 rows of ``make bench``'s table, ~2% of the chunk step); only a batch
    that fails it is searched row by row.
    """
    try:
        batch.validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    for name, column in zip(batch.schema.names, batch.columns):
        try:
            column.validate(full=True)
            continue
        except pa.ArrowInvalid as err:
            bad = _invalid_text_rows(column)
            if not bad:
                raise InvalidInputError(f"Column {name!r} of {what} holds invalid data: {err}") from None
        problems.add(
            f"invalid UTF-8 text in column {name!r}",
            np.asarray(bad, dtype=np.int64) + offset,
            advice="The file is not UTF-8 (e.g. latin-1 or cp1252 bytes): re-encode it as UTF-8 "
            "(e.g. iconv -f latin1 -t utf-8), or fix those rows.",
        )
    problems.raise_if_any(what)


def _invalid_text_rows(column: pa.Array) -> list[int]:
    """Return the indices of the values that do not decode as UTF-8 (error path: row by row)."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        bad = []
        for index, value in enumerate(column.view(binary).to_pylist()):
            if value is not None:
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append(index)
        return bad
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    rows = []
    for index in range(len(column)):
        try:
            column.slice(index, 1).to_pylist()
        except UnicodeDecodeError:
            rows.append(index)
    return rows
