"""The stream worker with one fault added: it SIGKILLs itself between "rows written" and "ack".

    python -m benchmarks.stream_chaos_worker <the worker's arguments>

``CHAOS_KILL_AFTER_WRITE`` (a probability, 0-1) kills it after that share of its writes;
``CHAOS_KILL_AFTER_WRITE_AT`` (a number n) after its n-th write (1 = the first). The kill comes
after the sink's transaction committed and before the queue heard of it: the worst moment for
a second bill. With ``CHAOS_WAIT_FOR_GO=1`` it imports everything, then waits for a line on
stdin before it starts: a warm spare that takes over within a second of a kill (a cold start
costs seconds of imports on a loaded machine). Used by tests/intake and ``make chaos-stream`` only.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from typing import Any

from airflow_batch_provider.intake.__main__ import main
from airflow_batch_provider.sinks.sql import SqlUpsertSink

_write_part = SqlUpsertSink.write_part
_writes = 0


def write_then_maybe_die(self: SqlUpsertSink, table: Any, chunk_index: int) -> int:
    """Write the part, then die if the dice (or the count) say so."""
    global _writes
    rows = _write_part(self, table, chunk_index)
    _writes += 1 if rows else 0
    at = int(os.environ.get("CHAOS_KILL_AFTER_WRITE_AT", "0") or 0)
    chance = float(os.environ.get("CHAOS_KILL_AFTER_WRITE", "0") or 0)
    if rows and ((at and _writes == at) or random.random() < chance):
        os.kill(os.getpid(), signal.SIGKILL)
    return rows


if __name__ == "__main__":
    SqlUpsertSink.write_part = write_then_maybe_die  # type: ignore[method-assign]
    if os.environ.get("CHAOS_WAIT_FOR_GO") == "1" and not sys.stdin.readline():
        raise SystemExit(0)  # the supervisor went away before needing this spare
    main()
