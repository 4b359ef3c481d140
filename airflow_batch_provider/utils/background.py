"""Run a generator one step ahead in a background thread, so that two stages of a loop overlap.

The chunk step uses it to build the next record batch's request lines (Arrow kernels, which
release the GIL) while the caller's thread hashes the current batch's fingerprints (Python,
which holds it). Items keep their order, at most ``depth`` wait, an exception raised by the
generator is raised in the caller at the same point of the sequence, and a caller that stops
early (an exception, ``break``) stops the thread before going on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()
_POLL_S = 0.1


class _Producer:
    """The background half of :func:`run_ahead`: drains ``items`` into a bounded queue until stopped."""

    def __init__(self, items: Iterator[object], depth: int) -> None:
        self.items = items
        self.ready: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
        self.stop = threading.Event()

    def put(self, entry: tuple[object, BaseException | None]) -> bool:
        """Queue ``entry``, waiting for room; return False when the consumer stopped meanwhile."""
        while not self.stop.is_set():
            try:
                self.ready.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        try:
            for item in self.items:
                if not self.put((item, None)):
                    return
            self.put((_END, None))
        except BaseException as exc:  # handed to the caller, raised there
            self.put((_END, exc))
        finally:
            close = getattr(self.items, "close", None)
            if close is not None:
                close()


def run_ahead(items: Iterator[T], *, depth: int = 2, name: str = "run-ahead") -> Iterator[T]:
    """Yield ``items`` in order while a background thread produces up to ``depth`` of them ahead."""
    producer = _Producer(items, depth)
    thread = threading.Thread(target=producer.run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = producer.ready.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item  # type: ignore[misc]
    finally:
        producer.stop.set()
        thread.join()
