"""The duplicate-id check's memory: one 64-bit hash per row, spilled to disk past a bound.

Keeping every custom_id string to find repeats would take ~100 bytes a row (1 GB at 10M rows);
one 64-bit ``hash()`` a row takes 8 (80 MB at 10M, 800 MB at 100M) and sorting them for the
check once doubled that. So the hashes stay in memory only up to :data:`SPILL_ROWS`; past it they
are partitioned by their top :data:`BUCKET_BITS` bits into that many local temporary files, and
the check sorts one bucket at a time: memory stays under ``SPILL_ROWS`` x 8 bytes plus one
bucket (10M rows: ~16 MB + ~1.3 MB) whatever the table's size. Python's ``hash()`` is salted per
process, so hashes are only ever compared within one run, and an equal hash is only a candidate:
the caller re-reads the table to confirm real duplicates.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

SPILL_ROWS = 2_000_000
BUCKET_BITS = 6


class IdHashes:
    """Collect one int64 hash per row; :meth:`repeated` returns the values seen more than once."""

    def __init__(self, spill_rows: int = SPILL_ROWS) -> None:
        self.spill_rows = spill_rows
        self._memory: list[np.ndarray] = []
        self._in_memory = 0
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._buckets: list[BinaryIO] = []

    def add(self, hashes: np.ndarray) -> None:
        """Add one batch's hashes (int64)."""
        if self._folder is not None:
            self._spill(hashes)
            return
        self._memory.append(hashes)
        self._in_memory += len(hashes)
        if self._in_memory > self.spill_rows:
            self._open_buckets()
            for part in self._memory:
                self._spill(part)
            self._memory, self._in_memory = [], 0

    def repeated(self) -> set[int]:
        """Return the hash values that occur more than once, and free everything collected."""
        try:
            if self._folder is None:
                return _repeats(np.concatenate(self._memory)) if self._memory else set()
            found: set[int] = set()
            for handle in self._buckets:
                handle.close()
                found |= _repeats(np.fromfile(handle.name, dtype=np.int64))
            return found
        finally:
            self.close()

    def close(self) -> None:
        """Remove the temporary files (also after an error)."""
        self._memory, self._in_memory = [], 0
        for handle in self._buckets:
            handle.close()
        self._buckets = []
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def _open_buckets(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="abp-id-hashes-")
        folder = Path(self._folder.name)
        self._buckets = [(folder / f"{index:03d}.i64").open("wb") for index in range(1 << BUCKET_BITS)]

    def _spill(self, hashes: np.ndarray) -> None:
        bucket = (hashes.view(np.uint64) >> np.uint64(64 - BUCKET_BITS)).astype(np.intp)
        order = np.argsort(bucket, kind="stable")
        ordered, ends = hashes[order], np.cumsum(np.bincount(bucket, minlength=len(self._buckets)))
        start = 0
        for index, end in enumerate(ends.tolist()):
            if end > start:
                self._buckets[index].write(ordered[start:end].tobytes())
            start = end


def _repeats(values: np.ndarray) -> set[int]:
    values.sort()
    return set(np.unique(values[1:][values[1:] == values[:-1]]).tolist())
