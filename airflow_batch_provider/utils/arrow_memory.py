"""Arrow memory that goes back to the OS as soon as it is freed, for the streaming steps.

The chunk step frees each record batch's buffers within milliseconds of allocating them, on four
threads. pyarrow's default allocator (mimalloc) keeps freed pages per thread for a while, so the
process's resident memory settled ~80 MB above what Arrow held live (measured at 1M rows: ~390 MB
peak RSS against ~40 MB of live Arrow buffers over a ~200 MB interpreter). jemalloc with its decay
time at 0 returns them at once: ~350 MB, at no measurable cost in speed (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa


@contextmanager
def returning_memory() -> Iterator[None]:
    """Make jemalloc with no decay Arrow's default pool inside the block (unchanged where pyarrow lacks jemalloc).

    Buffers remember the pool that allocated them, so restoring the previous default afterwards is
    safe for anything still alive. The decay setting is process-wide for the jemalloc pool.
    """
    try:
        pool = pa.jemalloc_memory_pool()
        pa.jemalloc_set_decay_ms(0)
    except NotImplementedError:  # a pyarrow build without jemalloc: keep its allocator
        yield
        return
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
