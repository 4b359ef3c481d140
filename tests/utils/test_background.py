"""run_ahead: order, errors at the same point, and a caller that stops early stops the thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from airflow_batch_provider.utils.background import run_ahead


def test_items_come_in_order_from_another_thread():
    threads: list[str] = []

    def numbers() -> Iterator[int]:
        for n in range(100):
            threads.append(threading.current_thread().name)
            yield n

    assert list(run_ahead(numbers(), depth=3, name="producer")) == list(range(100))
    assert set(threads) == {"producer"}


def test_an_error_is_raised_after_the_items_before_it():
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("row 3 is bad")

    seen: list[int] = []

    def consume() -> None:
        for item in run_ahead(failing()):
            seen.append(item)

    with pytest.raises(ValueError, match="row 3 is bad"):
        consume()
    assert seen == [1, 2]


def test_a_caller_that_stops_early_stops_and_closes_the_producer():
    produced: list[int] = []
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            n = 0
            while True:
                produced.append(n)
                yield n
                n += 1
        finally:
            closed.set()

    def consume() -> None:
        for item in run_ahead(endless(), depth=2):
            if item == 5:
                raise RuntimeError("the caller failed")

    with pytest.raises(RuntimeError):
        consume()
    assert closed.is_set()  # the generator was closed before the caller's error propagated
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) == count and count <= 5 + 1 + 2 + 1  # no more work after the stop; bounded ahead


def test_the_producer_runs_ahead_while_the_caller_works():
    second_started = threading.Event()

    def items() -> Iterator[int]:
        yield 0
        second_started.set()
        yield 1

    for item in run_ahead(items(), depth=1):
        if item == 0:  # still busy with item 0: the next one is being produced meanwhile
            assert second_started.wait(timeout=10), "the producer waited for the caller"
