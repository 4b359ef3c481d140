"""Arrow string kernels the chunk step builds requests with: text casts, concatenation, JSON escaping.

Each works on a whole array at once (pyarrow compute or numpy over the data buffer) and gives
byte for byte what the per-row Python would: ``str(value)``, ``orjson.dumps(text)``.
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc


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


def is_blank(texts: pa.Array) -> pa.Array:
    """Return, per string, whether it is empty or only whitespace (null stays null)."""
    return pc.or_(pc.equal(pc.binary_length(texts), 0), pc.utf8_is_space(texts))


def is_text(arrow_type: pa.DataType) -> bool:
    """Return True for the types whose values can be blank text (``str()`` of any other value never is)."""
    if pa.types.is_dictionary(arrow_type):
        return is_text(arrow_type.value_type)
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type)
