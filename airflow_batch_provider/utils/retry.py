"""Our retry policy above the SDKs' own (which give up after two retries).

The SDKs already retry connection errors, 408/409/429 and 5xx twice with short backoff.
For a nightly batch job that is too little: a provider hiccup of a minute must not fail the
DAG. Here each call gets a few more attempts with longer, capped, jittered backoff, and a
``Retry-After`` the SDK refused to honour (OpenAI ignores values over 120 s) is respected
up to ``max_delay``. :func:`iter_with_restarts` applies the same policy to a result stream
that breaks mid-way: the download half of "nothing lost, nothing twice".
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TypeVar

from airflow_batch_provider.exceptions import ProviderCallError

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How many extra attempts a provider call gets, and how long to wait between them."""

    attempts: int = 4
    base_delay: float = 2.0
    max_delay: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Return the wait before attempt ``attempt + 1`` (attempt counts from 1).

        A ``Retry-After`` is a lower bound, not an appointment: every request the server turned
        away at once is told the same value, and waiting exactly that long would send them all back
        together, to be turned away together again. So up to a quarter more is added at random.
        """
        if retry_after is not None and retry_after > 0:
            wait = min(retry_after, self.max_delay)
            return wait * (1 + random.random() / 4)
        backoff = min(self.base_delay * 2 ** (attempt - 1), self.max_delay)
        return backoff * (0.5 + random.random() / 2)


NO_RETRY = RetryPolicy(attempts=1)

Classifier = Callable[[BaseException], tuple[bool, float | None]]
"""Return (retryable, retry_after_seconds) for an exception raised by a provider call."""


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    classify: Classifier,
    policy: RetryPolicy,
    within: float | None = None,
    recover: Callable[[BaseException], T | None] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, a non-retryable error occurs, or attempts run out.

    ``within`` (seconds) also bounds the whole call: no attempt starts after that time has passed.
    ``recover`` runs before every new attempt, with the error of the last one: a call that may have
    taken effect although it failed (a create answered by a timeout, a 5xx or a dropped connection)
    looks up what it made there, and what it returns (not None) is the call's result, not resent.
    """
    give_up_at = None if within is None else time.monotonic() + within
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as exc:
            retryable, retry_after = classify(exc)
            if not retryable or attempt == policy.attempts:
                raise ProviderCallError(f"{what} failed after {attempt} attempt(s): {exc}") from exc
            wait = policy.delay(attempt, retry_after)
            if give_up_at is not None and time.monotonic() + wait > give_up_at:
                raise ProviderCallError(
                    f"{what} failed after {attempt} attempt(s) and is not retried past {within:.0f} s: {exc}"
                ) from exc
            log.warning("%s failed (%s); retrying in %.1f s (attempt %d/%d)", what, exc, wait, attempt, policy.attempts)
            time.sleep(wait)  # before looking: a call still on its way has that long to land
            found = recover(exc) if recover is not None else None
            if found is not None:
                log.warning("%s had taken effect although it failed: %s; it is not sent again", what, found)
                return found
    raise AssertionError("unreachable")  # pragma: no cover


async def acall_with_retries(
    fn: Callable[[], Awaitable[T]], *, what: str, classify: Classifier, policy: RetryPolicy
) -> T:
    """Async twin of :func:`call_with_retries`; waits with ``asyncio.sleep``."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return await fn()
        except Exception as exc:
            retryable, retry_after = classify(exc)
            if not retryable or attempt == policy.attempts:
                raise ProviderCallError(f"{what} failed after {attempt} attempt(s): {exc}") from exc
            wait = policy.delay(attempt, retry_after)
            log.warning("%s failed (%s); retrying in %.1f s (attempt %d/%d)", what, exc, wait, attempt, policy.attempts)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def retry_after_seconds(headers: object) -> float | None:
    """Read ``retry-after-ms`` or ``retry-after`` (seconds) from response headers, if any."""
    get = getattr(headers, "get", None)
    if get is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = get(name)
        if raw:
            try:
                return float(raw) * scale
            except ValueError:
                return None
    return None


def iter_with_restarts(
    open_stream: Callable[[], Generator[T]], *, what: str, classify: Classifier, policy: RetryPolicy
) -> Iterator[T]:
    """Yield ``open_stream()``'s items; when the stream breaks, reopen it and skip what was already yielded.

    For immutable result files: the provider serves the same bytes each time, so after a
    dropped connection the first ``n`` items of the new stream are the ``n`` already yielded and
    are skipped — no record is yielded twice and none is lost. Retryable errors (as ``classify``
    says) reopen the stream up to ``policy.attempts`` times without progress in between, waiting
    ``policy.delay``; a stream that moved forward since its last break starts a fresh count.
    """
    yielded = 0
    attempt = 1
    progress_at_last_break = 0
    while True:
        position = 0
        stream: Generator[T] | None = None
        try:
            stream = open_stream()
            for item in stream:
                position += 1
                if position <= yielded:
                    continue
                yielded += 1
                yield item
            return
        except Exception as exc:
            if yielded > progress_at_last_break:  # it moved on since the last break: a fresh budget
                attempt, progress_at_last_break = 1, yielded
            retryable, retry_after = classify(exc)
            if not retryable or attempt >= policy.attempts:
                raise ProviderCallError(f"{what} failed after {attempt} attempt(s): {exc}") from exc
            wait = policy.delay(attempt, retry_after)
            log.warning(
                "%s broke after %d record(s) (%s); reopening in %.1f s and skipping them (attempt %d/%d)",
                what,
                yielded,
                exc,
                wait,
                attempt,
                policy.attempts,
            )
            attempt += 1
            time.sleep(wait)
        finally:
            if stream is not None:
                stream.close()  # release the connection now, also when the caller stops early
