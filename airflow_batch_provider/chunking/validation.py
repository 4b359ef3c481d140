"""Input checks of the chunk step that neither the table readers nor the provider make for us.

- :func:`check_model_endpoint`: a model whose *name* says it cannot serve the endpoint.
- :func:`check_utf8`: text the parquet and jsonl readers pass through without validating.
- :func:`check_csv_quotes`: a csv quote that is never closed, which the csv reader turns into
  one value swallowing the rows after it instead of an error.

Each raises :class:`~airflow_batch_provider.exceptions.InvalidInputError` naming the row, line or
model at fault and what to do, before anything is written or uploaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_batch_provider.backends.registry import all_backends
from airflow_batch_provider.exceptions import InvalidInputError

if TYPE_CHECKING:
    from airflow_batch_provider.chunking.problems import RowProblems

# ------------------------------------------------------------------------------ model vs endpoint

_EMBEDDINGS = "/v1/embeddings"


def check_model_endpoint(model: str, endpoint: str) -> None:
    """Raise InvalidInputError when ``model``'s name says it cannot serve ``endpoint``.

    The rule is deliberately small, so no working setup is refused:

    - a name containing ``embed`` (``text-embedding-3-small``, ``nomic-embed-text``,
      ``Qwen3-Embedding-8B``), or one a backend calls an embedding model, is an embedding model:
      refused on every endpoint but ``/v1/embeddings``;
    - a name some installed backend calls a chat model
      (:meth:`~airflow_batch_provider.backends.base.Backend.model_kind`: OpenAI's ``gpt-*``,
      ``chatgpt-*``, ``o1``/``o3-*``/``o4-*``, Anthropic's ``claude-*``, optionally behind ``ft:``)
      that does not contain ``embed`` is refused on ``/v1/embeddings``. Any backend's word counts:
      a Claude model is a chat model on an OpenAI-compatible endpoint too.

    Any other name (self-hosted models, fine-tunes, aliases) is accepted on every endpoint.
    """
    kinds = {backend.model_kind(model) for backend in all_backends()}
    is_embedding = "embed" in model.lower() or "embedding" in kinds
    if endpoint == _EMBEDDINGS:
        if not is_embedding and "chat" in kinds:
            raise InvalidInputError(
                f"Model {model!r} is a chat model and cannot serve {_EMBEDDINGS}. Use an embedding model "
                "(e.g. 'text-embedding-3-small'), or endpoint='/v1/chat/completions' for chat requests."
            )
    elif is_embedding:
        raise InvalidInputError(
            f"Model {model!r} is an embedding model (by its name) and cannot serve {endpoint}. "
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


# ----------------------------------------------------------------------------------- csv quotes

_QUOTE, _COMMA, _LF, _CR = 0x22, 0x2C, 0x0A, 0x0D
# Bytes that may follow a closing quote or precede an opening one (RFC 4180; a quote for ""), as a lookup table.
_ENDS_FIELD = np.zeros(256, dtype=bool)
_ENDS_FIELD[[_COMMA, _LF, _CR, _QUOTE]] = True
_BOM = b"\xef\xbb\xbf"


def check_csv_quotes(blocks: Iterable[bytes], path: str) -> None:
    """Raise InvalidInputError when a quote in the csv ``blocks`` would merge rows into one value.

    The csv reader accepts a quoted value that is never closed (it runs to the end of the file)
    and a quote that closes in the middle of a later value; both silently read the rows in
    between as part of one value. The rule, with ``,`` as delimiter and ``"`` as quote:

    - a quote that opens a value (at the start of a field) and is never closed is an error;
    - a quoted value that spans a line break must be closed by a quote followed by the
      delimiter, a line break or the end of the file (RFC 4180); otherwise it is an error,
      naming the line where the value opens (where the closing quote is probably missing).

    Everything else reads as before: multi-line quoted values, ``""`` for a quote inside a
    quoted value, and the reader's leniency on one line (``15" screen``, ``"Big" kettle``).

    Speed: a vectorised pass checks that the quotes follow RFC 4180 (every opening quote at the
    start of a field, every closing quote followed by a delimiter or line end, an even count),
    which covers every correctly quoted file. Only from the first quote where that fails does a
    loop over the remaining quote characters follow the reader's rules to find a real problem.
    """
    scan = _QuoteScan(path)
    carry = b"\n"  # a line break before the file: the first byte starts a field
    first = True
    for block in blocks:
        if first and block.startswith(_BOM):
            block = block[len(_BOM) :]
        first = False
        if block:
            buffer = carry + block
            carry = buffer[scan.feed(buffer) - 1 :]
    scan.feed(carry + b"\n")  # the rest, followed by a virtual line break (the end of the file)
    scan.finish()


class _QuoteScan:
    """State of :func:`check_csv_quotes` across blocks.

    A buffer starts with the last byte analysed before (for the byte before the first one
    analysed) and :meth:`feed` leaves at least its last byte for the next buffer, so every byte
    analysed has its neighbours at hand, and a run of quotes is never split between buffers.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.exact = False  # False: the vectorised RFC 4180 check still holds; True: follow the reader
        self.in_quote = False
        self.open_line = 0  # line (1-based) and line breaks before the quote that opened the current value
        self.open_breaks = 0
        self.lines = 0  # line feeds analysed so far
        self.breaks = 0  # line feeds and carriage returns analysed so far

    def feed(self, buffer: bytes) -> int:
        """Analyse ``buffer[1:end]`` and return ``end``; the caller starts the next buffer at ``end - 1``."""
        end = len(buffer) - 1
        while end > 1 and buffer[end - 1] == _QUOTE and buffer[end] == _QUOTE:
            end -= 1  # keep a run of quotes in one buffer, so a "" is never split
        data = np.frombuffer(buffer, dtype=np.uint8)
        quotes = np.flatnonzero(data[1:end] == _QUOTE) + 1
        if quotes.size and not self.exact:
            self._check_rfc(data, quotes)
        if quotes.size and self.exact:
            self._follow_reader(buffer, data[:end], quotes)
        lf = buffer.count(b"\n", 1, end)
        self.lines += lf
        self.breaks += lf + buffer.count(b"\r", 1, end)
        return end

    def _check_rfc(self, data: np.ndarray, quotes: np.ndarray) -> None:
        """Check the quotes alternate open/close as RFC 4180 has them; else switch to :meth:`_follow_reader`.

        Up to here the reader and RFC 4180 agree on what is quoted, so the state carries over.
        """
        first_open = 1 if self.in_quote else 0
        opens, closes = quotes[first_open::2], quotes[1 - first_open :: 2]
        if not (_ENDS_FIELD[data[opens - 1]].all() and _ENDS_FIELD[data[closes + 1]].all()):
            self.exact = True
            return
        self.in_quote ^= bool(quotes.size % 2)
        if self.in_quote:  # a value opened here continues into the next buffer: note where it opened
            openers = opens[data[opens - 1] != _QUOTE]  # not the second quote of a ""
            if openers.size:
                at = int(openers[-1])
                lf = int(np.count_nonzero(data[1:at] == _LF))
                self.open_line = self.lines + lf + 1
                self.open_breaks = self.breaks + lf + int(np.count_nonzero(data[1:at] == _CR))

    def _follow_reader(self, buffer: bytes, data: np.ndarray, quotes: np.ndarray) -> None:
        """Walk the quotes as the csv reader does: a quote opens a value only at the start of a field."""
        lf = data[1:] == _LF
        lines = self.lines + np.concatenate(([0], np.cumsum(lf)))  # [at - 1]: line feeds before data[at]
        breaks = self.breaks + np.concatenate(([0], np.cumsum(lf | (data[1:] == _CR))))
        positions = quotes.tolist()
        i = 0
        while i < len(positions):
            at = positions[i]
            if not self.in_quote:
                if buffer[at - 1] in (_COMMA, _LF, _CR):
                    self.in_quote = True
                    self.open_line, self.open_breaks = int(lines[at - 1]) + 1, int(breaks[at - 1])
                i += 1  # elsewhere a quote is literal text
            elif buffer[at + 1] == _QUOTE:
                i += 2  # "" inside a quoted value
            else:
                self.in_quote = False
                if int(breaks[at - 1]) > self.open_breaks and buffer[at + 1] not in (_COMMA, _LF, _CR):
                    raise InvalidInputError(
                        f"{self.path} line {self.open_line}: a quoted value opens here and is closed only on line "
                        f"{int(lines[at - 1]) + 1}, by a quote followed by more text, so the csv reader would read "
                        f"the rows in between into that one value. Most likely the quote on line {self.open_line} "
                        'is not closed: close it, or write a quote inside a value as "".'
                    )
                i += 1

    def finish(self) -> None:
        """Raise when the file ended inside a quoted value."""
        if self.in_quote:
            raise InvalidInputError(
                f"{self.path} line {self.open_line}: a quoted value opens here and is never closed, so the csv "
                "reader would read every row after it into that one value. Close the quote, or write a quote "
                'inside a value as "".'
            )
