"""retry: backoff and Retry-After waits; restartable result streams (nothing lost, nothing twice)."""

from __future__ import annotations

import pytest

from airflow_batch_provider.exceptions import ProviderCallError
from airflow_batch_provider.utils.retry import RetryPolicy, iter_with_restarts

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.001)


class Flaky:
    """A stream of ``items`` whose first ``breaks`` openings fail after ``after`` items."""

    def __init__(self, items: list[int], breaks: list[int], exc: type[Exception] = ConnectionError) -> None:
        self.items = items
        self.breaks = list(breaks)
        self.exc = exc
        self.opened = 0

    def open(self):
        self.opened += 1
        stop = self.breaks.pop(0) if self.breaks else None
        for position, item in enumerate(self.items):
            if position == stop:
                raise self.exc("connection reset mid-stream")
            yield item


def _retry_connection_errors(exc: BaseException) -> tuple[bool, float | None]:
    return isinstance(exc, ConnectionError), None


def test_a_broken_stream_is_reopened_without_duplicates_or_losses():
    stream = Flaky(list(range(10)), breaks=[4, 7])
    got = list(iter_with_restarts(stream.open, what="download", classify=_retry_connection_errors, policy=FAST))
    assert got == list(range(10))
    assert stream.opened == 3


def test_progress_between_breaks_resets_the_attempt_budget():
    stream = Flaky(list(range(10)), breaks=[2, 4, 6, 8])  # four breaks, each after progress
    got = list(iter_with_restarts(stream.open, what="download", classify=_retry_connection_errors, policy=FAST))
    assert got == list(range(10))


def test_a_stream_that_keeps_breaking_at_once_gives_up():
    stream = Flaky(list(range(10)), breaks=[0, 0, 0, 0])
    with pytest.raises(ProviderCallError, match="after 3 attempt"):
        list(iter_with_restarts(stream.open, what="download", classify=_retry_connection_errors, policy=FAST))


def test_a_non_retryable_error_is_not_retried():
    stream = Flaky(list(range(10)), breaks=[3], exc=ValueError)
    got: list[int] = []

    def consume() -> None:
        got.extend(iter_with_restarts(stream.open, what="download", classify=_retry_connection_errors, policy=FAST))

    with pytest.raises(ProviderCallError, match="download failed after 1"):
        consume()
    assert got == [0, 1, 2] and stream.opened == 1


def test_stopping_early_closes_the_stream():
    closed = []

    def open_stream():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    stream = iter_with_restarts(open_stream, what="d", classify=_retry_connection_errors, policy=FAST)
    assert next(stream) == 0
    stream.close()
    assert closed == [True]


def test_retry_after_is_honoured_with_jitter_so_rejected_requests_do_not_return_in_lock_step():
    policy = RetryPolicy(attempts=4, base_delay=2.0, max_delay=60.0)
    waits = [policy.delay(1, 2.0) for _ in range(200)]
    assert min(waits) >= 2.0 and max(waits) <= 2.5  # never sooner than asked, at most a quarter later
    assert len({round(w, 3) for w in waits}) > 50  # spread out, not all at the same instant
    capped = [policy.delay(1, 600.0) for _ in range(50)]
    assert min(capped) >= 60.0 and max(capped) <= 75.0  # max_delay caps a huge Retry-After (plus jitter)


def test_backoff_without_retry_after_doubles_and_is_capped():
    policy = RetryPolicy(attempts=8, base_delay=1.0, max_delay=5.0)
    for attempt, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 5.0)):
        waits = [policy.delay(attempt, None) for _ in range(50)]
        assert ceiling / 2 <= min(waits) and max(waits) <= ceiling


def test_within_bounds_how_long_a_call_keeps_retrying():
    """A batch create must not keep retrying for minutes: it could land after the task's rerun created its own."""
    import time

    from airflow_batch_provider.utils.retry import call_with_retries

    calls = []

    def create():
        calls.append(time.monotonic())
        raise ConnectionError("provider busy")

    started = time.monotonic()
    with pytest.raises(ProviderCallError, match="not retried past 1 s"):
        call_with_retries(
            create,
            what="batch create",
            classify=lambda exc: (True, 0.6),  # retryable, Retry-After 0.6 s
            policy=RetryPolicy(attempts=10, base_delay=0.6, max_delay=0.6),
            within=1.0,
        )
    assert len(calls) == 2 and time.monotonic() - started < 1.5  # 10 attempts would take 6 s
