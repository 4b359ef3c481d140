"""Renderers: turn a request spec (:class:`~airflow_batch_provider.contract.SpecFields`) into wire-format lines.

A renderer turns ``(custom_id, user_text)`` pairs into JSONL lines in the provider's batch format;
each backend brings its own subclass (``backends/<name>/requests.py``), found through
:meth:`~airflow_batch_provider.backends.base.Backend.renderer`
(:func:`~airflow_batch_provider.chunking.spec.renderer_for` asks the spec's own backend).
Rendering is on the hot path (millions of rows), so a renderer serialises the full request
once with two sentinel strings in place of the custom id and the user text, splits the bytes
at the sentinels, and for a whole record batch splices in the escaped ids and texts with Arrow
kernels (escaped exactly as orjson does it, see
:func:`~airflow_batch_provider.chunking.arrow_text.json_escape`), leaving only the per-row sha256
of the fingerprint in Python. :meth:`RequestRenderer.request_dict` builds the same request as a
plain dict; it is the single source of truth and what the tests compare against. The split is
made on first use, not in the constructor, so a subclass may set the attributes its
``request_dict`` reads before or after calling ``super().__init__``.
"""

from __future__ import annotations

import functools
import hashlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from airflow_batch_provider.chunking.arrow_text import concat, json_escape
from airflow_batch_provider.contract import SpecFields
from airflow_batch_provider.exceptions import InvalidInputError


class RenderedRequests:
    """The request lines of one record batch, each ending in ``\\n``, in one contiguous Arrow buffer."""

    def __init__(self, lines: pa.Array, fingerprints: pa.Array) -> None:
        self.lines = lines  # large_string
        self.fingerprints = fingerprints  # string, 32 hex chars each
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
        data = lines.buffers()[2]
        self._data = memoryview(data if data is not None else b"")
        self.offsets = offsets  # line i is data[offsets[i]:offsets[i + 1]]
        self.sizes = np.diff(offsets)  # bytes per line, newline included

    def __len__(self) -> int:
        return len(self.lines)

    def data(self, start: int, stop: int) -> memoryview:
        """Return lines ``start`` … ``stop - 1`` as one block of bytes, newlines included."""
        return self._data[int(self.offsets[start]) : int(self.offsets[stop])]


# Sentinels contain NUL, which orjson escapes as \u0000: they cannot collide with ordinary text,
# and the split below checks that each occurs exactly once anyway.
_ID_SENTINEL = "\x00abp-custom-id\x00"
_TEXT_SENTINEL = "\x00abp-user-text\x00"


class _Template(NamedTuple):
    """One request line cut at the sentinels: head + id + middle + text + tail."""

    head: bytes
    middle: bytes
    tail: bytes
    fingerprint_base: Any  # a hashlib sha256 object over everything of the request but the id and text


class RequestRenderer(ABC):
    """Turn ``(custom_id, user_text)`` pairs into one provider's JSONL request lines."""

    provider: ClassVar[str]

    def __init__(self, spec: SpecFields) -> None:
        if spec.provider != self.provider:
            raise InvalidInputError(f"{type(self).__name__} renders {self.provider!r} requests, not {spec.provider!r}.")
        self.spec = spec
        self.endpoint: str = spec.endpoint

    @property
    def cache_note(self) -> str | None:
        """Say why the shared prefix goes uncached, for the chunk log (None: cached, off, or no such cache)."""
        return None

    @abstractmethod
    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        """Return the full request as a dict, ``custom_id`` first (what the tests check rendered lines against)."""

    @functools.cached_property
    def _template(self) -> _Template:
        """The request rendered once with the sentinels, cut around them (on first use: see the module doc)."""
        blob = orjson.dumps(self.request_dict(_ID_SENTINEL, _TEXT_SENTINEL))
        head, after_id = _split_once(blob, orjson.dumps(_ID_SENTINEL))
        middle, tail = _split_once(after_id, orjson.dumps(_TEXT_SENTINEL))
        # The id-less request that the fingerprint covers is "{" + middle without its leading comma
        # + text + tail (custom_id is the first key).
        if not head.endswith(b":") or not middle.startswith(b","):
            raise AssertionError("custom_id must be the first key of the request dict")
        base = hashlib.sha256(f"{self.spec.provider}\n{self.endpoint}\n".encode() + b"{" + middle[1:])
        return _Template(head, middle, tail, base)

    @property
    def body_suffix(self) -> str:
        """What follows the user text in every request: ``render_json(..., suffix=body_suffix)`` gives bodies."""
        return self._template.tail.decode()

    def lines_of(self, custom_ids: pa.Array, bodies: pa.Array) -> pa.Array:
        """Return the request lines for ``bodies`` (user text as a JSON literal + :attr:`body_suffix`)."""
        if len(custom_ids) != len(bodies):
            raise ValueError(f"{len(custom_ids)} custom ids but {len(bodies)} texts")
        head, middle = self._template.head.decode(), self._template.middle.decode()
        return concat(head + '"', json_escape(custom_ids), '"' + middle, bodies, "\n")

    def fingerprints(self, bodies: pa.Array) -> pa.Array:
        """Return the fingerprints of ``bodies`` as a string array (hex of the first 16 digest bytes)."""
        # The sha256 calls are the only per-row Python left (a plain loop is the fastest form);
        # the hex formatting happens once for the whole batch.
        copy = self._template.fingerprint_base.copy
        digests: list[bytes] = []
        add = digests.append
        for body in bodies.cast(pa.large_binary()).to_pylist():
            sha = copy()
            sha.update(body)
            add(sha.digest())
        first_halves = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 32)[:, :16]
        hexed = first_halves.tobytes().hex().encode()
        offsets = np.arange(0, 32 * len(bodies) + 1, 32, dtype=np.int32)
        return pa.StringArray.from_buffers(len(bodies), pa.py_buffer(offsets), pa.py_buffer(hexed))


def _split_once(blob: bytes, marker: bytes) -> tuple[bytes, bytes]:
    before, found, after = blob.partition(marker)
    if not found or marker in after:
        raise InvalidInputError("The request spec contains a reserved internal marker string; remove NUL characters.")
    return before, after
